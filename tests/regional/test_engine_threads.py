"""How many threads llama.cpp gets when the config says 0: the operator's OMP_NUM_THREADS, else the cores
this process may run on."""

from __future__ import annotations

import os

import pytest

from regional.llama_engine import default_threads


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("3", 3)])
def test_omp_num_threads_sets_the_default(monkeypatch: pytest.MonkeyPatch, value: str, expected: int):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert default_threads() == expected


@pytest.mark.parametrize("value", ["", "0", "-2", "two", "1,1"])
def test_without_a_usable_omp_setting_the_allowed_cores_count(monkeypatch: pytest.MonkeyPatch, value: str):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert default_threads() == len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert default_threads() == len(os.sched_getaffinity(0))
