"""Which engine a node runs: ``engine.kind = "auto" | "gpu" | "llama.cpp"``.

"auto" takes the torch engine when CUDA is present and torch is installed, llama.cpp otherwise; "gpu"
without CUDA runs the torch engine on the CPU (slow: for tests and parity checks). torch is imported only
when the torch engine is chosen or "auto" asks, so a llama.cpp node never needs it.
"""

from __future__ import annotations

import importlib.util
import logging

from regional.config import EngineConfig
from regional.gpu_probe import cuda_available
from regional.step_engine import StepEngine

log = logging.getLogger("nearshore.region")


def choose_kind(config: EngineConfig) -> str:
    if config.kind != "auto":
        return config.kind
    return "gpu" if cuda_available() else "llama.cpp"


def make_engine(model_name: str, model_path: str, config: EngineConfig) -> StepEngine:
    kind = choose_kind(config)
    if kind == "gpu":
        if importlib.util.find_spec("torch") is None or importlib.util.find_spec("gguf") is None:
            raise ValueError("engine.kind = gpu needs torch and gguf: pip install 'nearshore[torch]'")
        from regional.torch_engine import TorchEngine

        engine: StepEngine = TorchEngine(model_name, model_path, config)
    else:
        from regional.llama_engine import LlamaCppEngine

        engine = LlamaCppEngine(model_name, model_path, config)
    why = " (engine.kind = auto)" if config.kind == "auto" else ""
    log.info("engine: %s%s", engine.description(), why)
    return engine
