"""The peers of ``python -m bench.cache.embedder``, run in ANOTHER Python (one that has torch, etc.).

Nothing here is imported by Nearshore: the driver starts this file as a script with the peer's Python
(``--peer-python``), writes a JSON job on its standard input and reads one JSON answer from its standard
output. Backends:

    st          sentence-transformers (torch, CPU) on the model folder
    onnx        ONNX Runtime on an fp32 export of the same model (exported here with torch, once)
    onnx-int8   the same export, dynamically quantised to int8 by onnxruntime.quantization
    static      tokenlearn-static-model from PyPI: a static (Model2Vec-style) 64-dim model in the wheel

Usage (by the driver): PEER_PYTHON embedder_peers.py BACKEND MODEL_FOLDER WORK_FOLDER < job.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def main() -> None:
    backend, model_dir, work_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    job = json.load(sys.stdin)
    threads = int(job["threads"])
    started = time.perf_counter()
    embed = LOADERS[backend](model_dir, work_dir, threads)
    load_s = time.perf_counter() - started
    for text in job["queries"][:10]:  # warm-up
        embed([text])
    single_ms = []
    for text in job["queries"]:
        t = time.perf_counter()
        embed([text])
        single_ms.append((time.perf_counter() - t) * 1000)
    texts, size = job["batch_texts"], int(job["batch_size"])
    t = time.perf_counter()
    for i in range(0, len(texts), size):
        embed(texts[i : i + size])
    batch_s = time.perf_counter() - t
    vectors = embed(job["quality_texts"])
    json.dump(
        {
            "backend": backend,
            "load_s": load_s,
            "single_ms": single_ms,
            "batch_texts_per_s": len(texts) / batch_s,
            "quality_vectors": np.asarray(vectors, dtype=np.float32).tolist(),
        },
        sys.stdout,
    )


def load_st(model_dir: Path, _work: Path, threads: int):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(model_dir), device="cpu")

    def embed(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            return model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)

    return embed


def export_onnx(model_dir: Path, work_dir: Path) -> Path:
    """model.onnx beside the work folder, exported once from the Transformer module of the model."""
    target = work_dir / "minilm.onnx"
    if target.is_file():
        return target
    import torch
    from sentence_transformers import SentenceTransformer

    work_dir.mkdir(parents=True, exist_ok=True)
    bert = SentenceTransformer(str(model_dir), device="cpu")[0].auto_model.eval()

    class Encoder(torch.nn.Module):  # positional inputs, one output: what the exporter traces cleanly
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    ids = torch.ones((2, 16), dtype=torch.int64)
    axes = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        _export(torch, Encoder().eval(), ids, axes, target)
    return target


def _export(torch, module, ids, axes, target: Path) -> None:
    torch.onnx.export(
        module,
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        str(target),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes},
        opset_version=17,
        dynamo=False,
    )


def quantise_onnx(model_dir: Path, work_dir: Path) -> Path:
    target = work_dir / "minilm-int8.onnx"
    if not target.is_file():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(export_onnx(model_dir, work_dir)), str(target), weight_type=QuantType.QInt8)
    return target


def _ort_embedder(model_dir: Path, onnx_file: Path, threads: int):
    import onnxruntime as ort
    from tokenizers import Tokenizer

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.enable_padding()

    def embed(texts: list[str]) -> np.ndarray:
        encoded = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = session.run(None, feed)[0]
        m = mask[..., None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / m.sum(axis=1)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return embed


def load_onnx(model_dir: Path, work_dir: Path, threads: int):
    return _ort_embedder(model_dir, export_onnx(model_dir, work_dir), threads)


def load_onnx_int8(model_dir: Path, work_dir: Path, threads: int):
    return _ort_embedder(model_dir, quantise_onnx(model_dir, work_dir), threads)


def load_static(_model_dir: Path, _work: Path, _threads: int):
    from static_model import get_embeddings

    def embed(texts: list[str]) -> np.ndarray:
        return np.asarray(get_embeddings(list(texts)), dtype=np.float32)

    return embed


LOADERS = {"st": load_st, "onnx": load_onnx, "onnx-int8": load_onnx_int8, "static": load_static}

if __name__ == "__main__":
    main()
