"""The tokenizer's one thread takes turns between keys (edge/fair_worker.py): a key's flood of long prompts
waits behind itself, not in front of another key's prompt."""

from __future__ import annotations

import asyncio
import threading

import pytest

from edge.fair_worker import FairWorker


class Gate:
    """Jobs that each wait for their own release, so the test decides when the thread finishes one."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.releases: dict[str, threading.Event] = {}

    def job(self, name: str):
        release = self.releases.setdefault(name, threading.Event())

        def run() -> str:
            self.started.append(name)
            assert release.wait(30)
            return name

        return run


async def _until(condition, worker_turns: int = 10_000) -> None:
    for _ in range(worker_turns):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the worker never got there")


async def test_a_floods_next_job_waits_for_another_keys_job():
    worker: FairWorker[str] = FairWorker("test-fair")
    gate = Gate()
    try:
        flood = [asyncio.create_task(worker.run("a", gate.job(f"a{i}"))) for i in range(5)]
        await _until(lambda: gate.started == ["a0"])
        other = asyncio.create_task(worker.run("b", gate.job("b0")))
        await asyncio.sleep(0)
        for name in ("a0", "a1", "b0", "a2", "a3", "a4"):
            await _until(lambda name=name: name in gate.started)
            gate.releases[name].set()
        assert await other == "b0"
        assert await asyncio.gather(*flood) == ["a0", "a1", "a2", "a3", "a4"]
        # b's one job ran after a's running one and the one a queued before it, not after all five
        assert gate.started == ["a0", "a1", "b0", "a2", "a3", "a4"]
    finally:
        worker.close()


async def test_a_job_whose_caller_left_is_dropped_and_errors_reach_their_caller():
    worker: FairWorker[str] = FairWorker("test-fair")
    gate = Gate()
    try:
        first = asyncio.create_task(worker.run("a", gate.job("first")))
        await _until(lambda: gate.started == ["first"])
        left = asyncio.create_task(worker.run("b", gate.job("left")))
        await asyncio.sleep(0)
        left.cancel()

        def broken() -> str:
            raise ValueError("a vocabulary that cannot count this")

        failing = asyncio.create_task(worker.run("c", broken))
        gate.releases["first"].set()
        assert await first == "first"
        with pytest.raises(ValueError, match="cannot count"):
            await failing
        assert "left" not in gate.started and worker.waiting == 0
    finally:
        worker.close()
