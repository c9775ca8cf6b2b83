"""The same MiniLM encoder run by ONNX Runtime: its graph is written here from the safetensors weights.

No export step and no torch: the ONNX graph of the encoder's layers (matrix products, attention with the
padding bias, LayerNorm, erf GELU) is assembled with ``onnx.helper`` from the weights already read by
:class:`~cache.embedder.MiniLMEmbedder`, and handed to an ``onnxruntime`` session in memory. Tokenizing,
the embedding lookup, pooling and normalisation stay in numpy; only the layers change. (This module
imports nothing of cache.embedder, which imports it: it takes the shape and weights as they are.)

Why: on this machine ONNX Runtime's matrix products (MLAS) ran one query in about two thirds of the time
of numpy's OpenBLAS and a batch in half, with the same vectors (cosine to sentence-transformers >= 0.9999999;
figures in cache/embedder.py's docstring).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from nearshore.cache_home import cache_home, write_whole


class OrtLayers:
    """The layers of a loaded encoder in one ONNX Runtime session: ``(x, bias, B, S) -> x``, like numpy's."""

    def __init__(self, shape: Any, layers: list[Any], threads: int = 1, int8: bool = False) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle pool threads sleep instead of spinning: the event loop shares these cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.shape = shape
        graph = encoder_graph(shape, layers)
        self.session = ort.InferenceSession(
            quantized(graph) if int8 else graph, options, providers=["CPUExecutionProvider"]
        )

    def __call__(self, x: np.ndarray, bias: np.ndarray, b: int, n: int) -> np.ndarray:
        s = self.shape
        feed = {
            "x": x,
            "bias": bias,
            "qkv_shape": np.array([b, n, 3, s.heads, s.head_dim], dtype=np.int64),
            "flat_shape": np.array([b * n, s.hidden], dtype=np.int64),
        }
        return self.session.run(None, feed)[0]


def encoder_graph(s: Any, layers: list[Any]) -> bytes:
    """The serialised ONNX model of the layers (cache.embedder's BertShape and Layer weights, the query
    already scaled): x [T, H] and the padding bias [B, 1, 1, S] in, x [T, H] out."""
    from onnx import TensorProto, helper, numpy_helper

    nodes: list = []
    weights: list = []

    def const(name: str, value: np.ndarray) -> str:
        weights.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(kind: str, *inputs: str, **attributes: object) -> str:
        out = f"{kind}_{len(nodes)}"
        nodes.append(helper.make_node(kind, list(inputs), [out], **attributes))
        return out

    half = const("half", np.array(0.5, np.float32))
    one = const("one", np.array(1.0, np.float32))
    rsqrt2 = const("rsqrt2", np.array(1.0 / np.sqrt(2.0), np.float32))
    axis0 = const("axis0", np.array([0], np.int64))
    eps = s.layer_norm_eps
    x = "x"
    for i, w in enumerate(layers):
        p = f"layer{i}."
        qkv = op("Add", op("MatMul", x, const(p + "qkv_w", w.qkv_w)), const(p + "qkv_b", w.qkv_b))
        # [T, 3H] -> [3, B, heads, S, D]: the query is already scaled by 1/sqrt(D)
        qkv = op("Transpose", op("Reshape", qkv, "qkv_shape"), perm=[2, 0, 3, 1, 4])
        parts = [f"{p}{name}" for name in ("q", "k", "v")]
        nodes.append(helper.make_node("Split", [qkv], parts, axis=0, num_outputs=3))
        q, k, v = (op("Squeeze", part, axis0) for part in parts)
        scores = op("Add", op("MatMul", q, op("Transpose", k, perm=[0, 1, 3, 2])), "bias")
        context = op("Transpose", op("MatMul", op("Softmax", scores, axis=-1), v), perm=[0, 2, 1, 3])
        context = op("Reshape", context, "flat_shape")
        attended = op(
            "Add",
            op("Add", op("MatMul", context, const(p + "out_w", w.out_w)), const(p + "out_b", w.out_b)),
            x,
        )
        x = op(
            "LayerNormalization",
            attended,
            const(p + "n1_g", w.norm1_g),
            const(p + "n1_b", w.norm1_b),
            axis=-1,
            epsilon=eps,
        )
        hidden = op("Add", op("MatMul", x, const(p + "up_w", w.up_w)), const(p + "up_b", w.up_b))
        if s.exact_gelu:
            gate = op("Add", op("Erf", op("Mul", hidden, rsqrt2)), one)
        else:
            cube = op("Mul", op("Mul", hidden, hidden), hidden)
            inner = op("Add", hidden, op("Mul", cube, const(p + "c3", np.array(0.044715, np.float32))))
            gate = op(
                "Add",
                op("Tanh", op("Mul", inner, const(p + "c1", np.array(np.sqrt(2 / np.pi), np.float32)))),
                one,
            )
        gelu = op("Mul", op("Mul", hidden, half), gate)
        out = op(
            "Add",
            op("Add", op("MatMul", gelu, const(p + "down_w", w.down_w)), const(p + "down_b", w.down_b)),
            x,
        )
        x = op(
            "LayerNormalization",
            out,
            const(p + "n2_g", w.norm2_g),
            const(p + "n2_b", w.norm2_b),
            axis=-1,
            epsilon=eps,
        )
    nodes.append(helper.make_node("Identity", [x], ["hidden"]))
    graph = helper.make_graph(
        nodes,
        "sentence-encoder",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", s.hidden]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["B", 1, 1, "S"]),
            helper.make_tensor_value_info("qkv_shape", TensorProto.INT64, [5]),
            helper.make_tensor_value_info("flat_shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["T", s.hidden])],
        weights,
    )
    # IR 9 with opset 18 (Split's num_outputs, LayerNormalization): what onnxruntime >= 1.16 reads.
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    return onnx_model.SerializeToString()


def quantized(graph: bytes, folder: Path | None = None) -> bytes:
    """The graph with its matrix products in int8: weights quantised per output channel, activations per
    call. Per channel, the vectors stay within cosine 0.99 of fp32's (per tensor: 0.95). Quantising takes
    1.8 s of CPU here, at every load of an edge's or a region's embedder: so it is done once per graph and
    onnxruntime version and kept (``cache_home()/embedder``); a kept copy that does not read back whole is
    made again."""
    import onnxruntime

    identity = hashlib.sha256(graph + f"\0{onnxruntime.__version__}\0{_RECIPE}".encode()).hexdigest()
    path = (folder or cache_home() / "embedder") / f"int8-{identity[:32]}.onnx"
    try:
        kept = path.read_bytes()
        if hashlib.sha256(kept[32:]).digest() == kept[:32]:
            return kept[32:]
    except OSError:
        pass
    made = _quantize(graph)
    with contextlib.suppress(OSError):  # a folder that cannot be written costs the next load the 1.8 s
        write_whole(path, lambda temporary: temporary.write_bytes(hashlib.sha256(made).digest() + made))
    return made


_RECIPE = "dynamic per-channel QInt8 MatMul"  # what _quantize does: a new name when it changes


def _quantize(graph: bytes) -> bytes:
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    quiet = _QuantiserChatter()
    root.addFilter(quiet)  # the quantiser logs its progress and advice to the root logger
    with tempfile.TemporaryDirectory(prefix="nearshore-embedder-") as folder:
        source, target = Path(folder) / "fp32.onnx", Path(folder) / "int8.onnx"
        source.write_bytes(graph)
        try:
            quantize_dynamic(
                source, target, per_channel=True, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"]
            )
        finally:
            root.removeFilter(quiet)
        return target.read_bytes()


class _QuantiserChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "quantization" not in Path(record.pathname).parts
