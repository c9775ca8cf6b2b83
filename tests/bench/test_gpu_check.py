"""``nearshore gpu-check`` runs here the way it would on a GPU machine (``--device cpu``, small sizes), and
refuses plainly where there is no GPU; its cross-talk and decode-timing parts on a tiny model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from bench.gpu.decode import kv_bytes_read, time_decode, weight_bytes
from nearshore.children import nearshore_argv
from tests.gpu.test_paged_model import tiny_gemma


def test_without_a_gpu_it_says_so_and_exits_2():
    done = subprocess.run(nearshore_argv("gpu-check"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stdout


@pytest.mark.slow
def test_the_whole_check_runs_on_the_cpu(tmp_path: Path):
    out = tmp_path / "check.json"
    argv = nearshore_argv(
        "gpu-check",
        "--device",
        "cpu",
        "--batch-sizes",
        "1,2",
        "--context",
        "32",
        "--steps",
        "2",
        "--parity",
        "quick",
        "--json",
        str(out),
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["kernels"] == {"skipped": "not on a CUDA device"}
    assert report["parity"]["exact"]["top1"] >= 0.99 and report["parity"]["served"]["positions"] > 50
    assert report["crosstalk"]["top1"] == 1.0 and report["crosstalk"]["preemptions"] >= 1
    assert [t["batch"] for t in report["decode"]["graphs"]] == [1, 2]
    assert set(report["llama_cpp_tokens_per_s"]) == {"1", "2"}
    assert "x floor" in done.stdout and "all checks passed" in done.stdout


def test_the_floor_counts_weights_once_and_each_sequences_visible_keys():
    model = tiny_gemma()
    c = model.config
    per_token = 2 * c.num_kv_heads * c.head_dim * 4
    # two sliding layers see at most 6 keys, the global one all 10
    assert kv_bytes_read(model, 10, batch=3, dtype=torch.float32) == 3 * per_token * (6 + 6 + 10)
    tied = sum(t.numel() * 4 for t in {id(t): t for t in model.buffers() if t is not None}.values())
    assert weight_bytes(model) == tied
    timings = time_decode(model, [1, 3], 10, 2, bandwidth_bytes_per_s=1e9, graphs=True, block_size=4)
    assert [t.batch for t in timings] == [1, 3] and not any(t.graphs for t in timings)  # no CUDA here
    assert all(t.floor_ms > 0 and t.over_floor == pytest.approx(t.step_ms / t.floor_ms) for t in timings)
