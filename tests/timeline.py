"""Where the suite's time goes, and the order that keeps its end short.

``NEARSHORE_TEST_TIMELINE=FILE`` appends one JSON line per test (worker, start and end in wall-clock
seconds, the test's id), so a run's tail can be read afterwards (which tests ran last, on which worker,
while the other workers were idle): ``python -m tests.timeline FILE``.

The order: test files run longest first, by ``module_seconds.json`` (each file's seconds in a recorded run:
``python -m tests.timeline --modules FILE > tests/module_seconds.json``), a file not listed before them all,
each file's tests together and in their own order. pytest-xdist's worksteal hands each worker a third of the
list and lets an idle one take the end of another's queue: with the long files at the front, what is left
at the end is short tests, not a two-minute one that starts when the other workers have run out.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TIMELINE = os.environ.get("NEARSHORE_TEST_TIMELINE", "")
MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (the module docstring says why); a stable sort keeps each file's own order."""
    try:
        seconds: dict[str, float] = json.loads(MODULE_SECONDS.read_text())
    except (OSError, ValueError):
        return
    unknown = float("inf")
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], unknown))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    started = time.time()
    yield
    if TIMELINE:
        row = {"worker": os.environ.get("PYTEST_XDIST_WORKER", ""), "start": started, "end": time.time()}
        with open(TIMELINE, "a") as out:
            out.write(json.dumps({**row, "test": item.nodeid}) + "\n")


def tail(path: str, rows: int = 15) -> str:
    """The run's tail: when each worker ran out of tests, and the tests still running after the first did,
    longest first."""
    with open(path) as lines:
        tests = [json.loads(line) for line in lines]
    ends: dict[str, float] = {}
    for t in tests:
        ends[t["worker"]] = max(ends.get(t["worker"], 0.0), t["end"])
    begin, first_idle = min(t["start"] for t in tests), min(ends.values())
    lines = [f"{w or 'main'}: last test ended at {end - begin:.0f} s" for w, end in sorted(ends.items())]
    late = sorted((t for t in tests if t["end"] > first_idle), key=lambda t: t["start"] - t["end"])
    lines += [
        f"{t['end'] - t['start']:6.1f} s  {t['worker']}  {t['start'] - begin:5.0f}-{t['end'] - begin:.0f} s  "
        f"{t['test']}"
        for t in late[:rows]
    ]
    return "\n".join(lines)


def module_seconds(path: str) -> dict[str, float]:
    """Each test file's seconds in a recorded run, longest first."""
    totals: dict[str, float] = {}
    with open(path) as lines:
        for line in lines:
            t = json.loads(line)
            module = t["test"].split("::", 1)[0]
            totals[module] = totals.get(module, 0.0) + t["end"] - t["start"]
    return {m: round(s, 1) for m, s in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":  # python -m tests.timeline [--modules] FILE
    import sys

    if sys.argv[1] == "--modules":
        print(json.dumps(module_seconds(sys.argv[2]), indent=1))
    else:
        print(tail(sys.argv[1]))
