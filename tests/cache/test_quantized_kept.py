"""The embedder's int8 graph is quantised once per graph and kept (cache/embedder_ort.py quantized): a later
load reads it back instead of quantising again (1.8 s of CPU per edge or region), a kept copy that does not
read back whole is made again, and a folder that cannot be written costs only the quantising."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cache import embedder_ort


def one_matmul_graph(seed: int = 0) -> bytes:
    weight = np.random.default_rng(seed).standard_normal((8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "one-matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 8])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    return model.SerializeToString()


def run(graph: bytes, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(graph, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


class Counting:
    def __init__(self) -> None:
        self.calls = 0
        self.real = embedder_ort._quantize

    def __call__(self, graph: bytes) -> bytes:
        self.calls += 1
        return self.real(graph)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Counting:
    counter = Counting()
    monkeypatch.setattr(embedder_ort, "_quantize", counter)
    return counter


def test_a_graph_is_quantised_once_and_read_back_after(tmp_path: Path, counting: Counting):
    graph, x = one_matmul_graph(), np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    first = embedder_ort.quantized(graph, tmp_path)
    again = embedder_ort.quantized(graph, tmp_path)
    assert again == first and counting.calls == 1
    np.testing.assert_allclose(run(again, x), run(graph, x), atol=0.1)  # int8 products, close to fp32
    embedder_ort.quantized(one_matmul_graph(seed=2), tmp_path)  # another graph: its own copy
    assert counting.calls == 2 and len(list(tmp_path.glob("int8-*.onnx"))) == 2


def test_a_damaged_copy_is_made_again_and_an_unwritable_folder_costs_only_the_time(
    tmp_path: Path, counting: Counting
):
    graph = one_matmul_graph()
    made = embedder_ort.quantized(graph, tmp_path)
    (kept,) = tmp_path.glob("int8-*.onnx")
    kept.write_bytes(kept.read_bytes()[:-10])  # cut short
    assert embedder_ort.quantized(graph, tmp_path) == made and counting.calls == 2
    assert embedder_ort.quantized(graph, tmp_path) == made and counting.calls == 2  # whole again

    blocked = tmp_path / "a-file"
    blocked.write_text("where the folder would be")
    assert embedder_ort.quantized(graph, blocked / "embedder") == made
    assert embedder_ort.quantized(graph, blocked / "embedder") == made and counting.calls == 4
