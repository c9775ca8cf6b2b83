"""Where the suite's time goes: ``NEARSHORE_TEST_TIMELINE=FILE`` appends one JSON line per test (worker,
start and end in wall-clock seconds, the test's id), so a run's tail can be read afterwards (which tests ran
last, on which worker, while the other workers were idle): ``python -m tests.timeline FILE``;
``--modules FILE`` sums each test file's seconds.

Tried and measured: the files longest first, each whole on one worker (``--dist loadfile``), to end the run on
short files. It did end on them (three workers within a second of each other), but the files that mostly wait
(failover deadlines, faults, providers) then ran side by side, and the cores idled there instead: pytest took
805-816 s on two clean clones, against 727-767 s with worksteal in the order files are found.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

TIMELINE = os.environ.get("NEARSHORE_TEST_TIMELINE", "")


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
