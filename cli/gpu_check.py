"""``nearshore gpu-check``: the torch engine on this machine's GPU, checked and timed in one command.

In order: the CUDA kernels against the torch reference; teacher-forced parity with llama.cpp on the same
GGUF; no cross-talk between streams decoded together; the device's copy bandwidth; decode steps at each
batch size (CUDA graphs on and off) against the memory-bandwidth floor; llama.cpp's rate at the same batch
sizes on the same machine. It installs nothing: without CuPy the kernels are skipped and it says how to get
them. ``--device cpu`` runs the same checks on the CPU (slowly; what the tests run).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

TARGET_OVER_FLOOR = 1.5  # the target for a decode step at batch 64, CUDA graphs on
TARGET_BATCH = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--model", default="", help="a GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--batch-sizes", default="1,8,32,64,128", help="decode steps timed at these")
    parser.add_argument("--context", type=int, default=512, help="tokens each sequence holds when timed")
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed per batch size")
    parser.add_argument(
        "--parity",
        choices=["full", "quick", "off"],
        default="full",
        help="full: 20 prompts with continuations and a long text (2k+ positions); quick: 2 short ones",
    )
    parser.add_argument("--no-llama", action="store_true", help="skip llama.cpp's rates")
    parser.add_argument("--json", default="", help="also write every figure here")


def main(args: argparse.Namespace) -> int:
    import torch

    cuda = torch.cuda.is_available()
    if (args.device == "cuda" and not cuda) or (args.device == "auto" and not cuda):
        print(
            "gpu-check: no CUDA device here (torch sees none); --device cpu runs the same checks on the CPU"
        )
        return 2
    device = torch.device("cuda" if args.device in ("auto", "cuda") else "cpu")
    dtype = _dtype(device)
    report: dict[str, Any] = {"device": _device_name(device), "dtype": str(dtype), "torch": torch.__version__}
    print(f"gpu-check on {report['device']} ({report['dtype']}, torch {torch.__version__})")
    from regional.model_store import resolve_model_path

    path = str(resolve_model_path(args.model))
    failures: list[str] = []
    report["kernels"] = _kernels(device, failures)
    from gpu.model import CausalLM

    started = time.perf_counter()
    model = CausalLM.load(path, device=device, dtype=dtype)
    report["load_s"] = round(time.perf_counter() - started, 2)
    report["parity"] = _parity(args.parity, path, device, dtype, model, failures)
    report["crosstalk"] = _crosstalk(model, path, failures)
    report["decode"] = _decode(model, device, args)
    if not args.no_llama:
        from bench.gpu.llama_decode_rate import llama_decode_rates

        print("llama.cpp on this machine's CPU, the same batches:")
        rates = llama_decode_rates(path, _ints(args.batch_sizes), args.context, max(3, args.steps // 4))
        report["llama_cpp_tokens_per_s"] = {str(b): round(r, 1) for b, r in rates.items()}
    _summary(report)
    report["failures"] = failures
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print("gpu-check: " + ("all checks passed" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _dtype(device: Any) -> Any:
    import torch

    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _device_name(device: Any) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _kernels(device: Any, failures: list[str]) -> dict[str, Any]:
    from gpu import cuda_kernels

    if device.type != "cuda":
        return {"skipped": "not on a CUDA device"}
    if not cuda_kernels.available():
        print("kernels: skipped: CuPy is not installed (pip install 'nearshore[gpu]'); the torch path runs")
        return {"skipped": "CuPy not installed"}
    from bench.gpu.kernels import run_kernel_checks

    print("kernels against the torch reference:")
    checks = run_kernel_checks()
    for c in checks:
        print(
            f"  {'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}; kernel {c.kernel_ms:.3f} ms, "
            f"torch {c.reference_ms:.3f} ms"
        )
        if not c.passed:
            failures.append(f"kernel {c.name}")
    return {"checks": [vars(c) if hasattr(c, "__dict__") else c._asdict() for c in checks]}


def _parity(mode: str, path: str, device: Any, dtype: Any, model: Any, failures: list[str]) -> dict[str, Any]:
    import torch

    if mode == "off":
        return {"skipped": "--parity off"}
    from bench.gpu.parity import PROMPTS, teacher_forced_parity

    print(f"teacher-forced parity with llama.cpp ({mode}):")
    quick = mode == "quick"
    result = teacher_forced_parity(
        path,
        device=str(device),
        dtype=dtype,
        prompts=PROMPTS[:2] if quick else PROMPTS,
        continuation_tokens=24 if quick else 100,
        long_tokens=0 if quick else 800,
        exact=True,
        model=model,
        log=lambda line: print("  " + line),
    )
    served, noise = result.served, result.llama_self
    # Against llama.cpp as served (Q4_K_M) agreement is bounded by llama.cpp's own arithmetic: it disagrees
    # with itself on ~3% of positions when only its KV cache goes fp16 -> fp32, so that figure is reported,
    # not judged. What is judged is the function: llama.cpp in fp32 on the GGUF's F32 copy, where the torch
    # model must agree on 99% of positions in fp32 (97% in bf16/fp16, whose rounding moves near-ties).
    floor = 0.99 if dtype == torch.float32 else 0.97
    if result.exact is not None and result.exact.top1 < floor:
        failures.append(f"parity on the F32 copy: top-1 {result.exact.top1:.4f} < {floor}")
    out = {"served": _report(served), "llama_self": _report(noise)}
    if result.exact is not None:
        out["exact"] = _report(result.exact)
    return out


def _report(r: Any) -> dict[str, float]:
    return {"positions": r.positions, "top1": round(r.top1, 5), "mean_kl": r.mean_kl, "max_kl": r.max_kl}


def _crosstalk(model: Any, path: str, failures: list[str]) -> dict[str, Any]:
    from bench.gpu.crosstalk import check_crosstalk
    from regional.llama_model import ContextSettings, LlamaModel

    vocab = LlamaModel(path, ContextSettings(0, 0, 1, 1), vocab_only=True)
    try:
        shared = vocab.tokenize("You are a helpful assistant for travellers in West Africa. ")
        questions = ["Where is Lagos?", "What is jollof rice?", "How far is Accra from Lagos by road?"]
        prompts = [shared + vocab.tokenize(q, add_special=False) for q in questions]
        prompts.append(vocab.tokenize("Tell me about the harbour. " * 8))
    finally:
        vocab.close()
    block_size, max_tokens = 16, 40
    # A pool a little larger than the longest stream alone, and answers long enough to outgrow the blocks
    # they were admitted with: the others wait, share and get preempted, however the scheduler orders steps.
    longest = max(len(p) for p in prompts) + max_tokens
    num_blocks = longest // block_size + 3
    result = check_crosstalk(
        model, prompts, max_tokens, num_blocks, block_size, batch_tokens=128, prefill_chunk=16
    )
    print(f"no cross-talk: {result.summary()}")
    if result.top1_agreement < 1.0:
        failures.append(f"cross-talk: top-1 {result.top1_agreement:.4f} between batched and alone")
    return {
        "positions": result.positions,
        "top1": result.top1_agreement,
        "max_abs_diff": result.max_abs_diff,
        "preemptions": result.preemptions,
        "prefix_hit_tokens": result.prefix_hit_tokens,
    }


def _decode(model: Any, device: Any, args: argparse.Namespace) -> dict[str, Any]:
    from bench.gpu.decode import copy_bandwidth, time_decode

    bandwidth = copy_bandwidth(device, megabytes=1024 if device.type == "cuda" else 128)
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s; decode steps of {args.context}-token sequences:")
    sizes = _ints(args.batch_sizes)
    timings = time_decode(model, sizes, args.context, args.steps, bandwidth, graphs=True)
    eager = []
    if any(t.graphs for t in timings):
        eager = time_decode(model, sizes, args.context, args.steps, bandwidth, graphs=False)
    return {
        "bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "graphs": [t.to_dict() for t in timings],
        "eager": [t.to_dict() for t in eager],
    }


def _summary(report: dict[str, Any]) -> None:
    timings = report["decode"]["graphs"]
    llama = report.get("llama_cpp_tokens_per_s", {})
    print("\nbatch   step ms   tok/s      floor ms  x floor   llama.cpp tok/s   x llama.cpp")
    for t in timings:
        theirs = llama.get(str(t["batch"]))
        ratio = f"{t['tokens_per_s'] / theirs:10.1f}" if theirs else f"{'-':>10}"
        print(
            f"{t['batch']:>5} {t['step_ms']:9.2f} {t['tokens_per_s']:9.1f} {t['floor_ms']:11.3f} "
            f"{t['over_floor']:7.2f}x {theirs or 0:15.1f} {ratio}"
        )
    at = next((t for t in timings if t["batch"] == TARGET_BATCH and t["graphs"]), None)
    if at is not None:
        verdict = "met" if at["over_floor"] <= TARGET_OVER_FLOOR else "missed"
        print(
            f"target: batch {TARGET_BATCH} within {TARGET_OVER_FLOOR}x of the floor: {verdict} "
            f"({at['over_floor']:.2f}x)"
        )
        report["target"] = {"over_floor": at["over_floor"], "met": verdict == "met"}
