"""The load report every region response carries (regional/load_report.py): made at most once per max_age_s
from one engine snapshot, except that a lifecycle change (loaded, failed) is told on the next response."""

from __future__ import annotations

from regional.engine import EngineState, EngineStats
from regional.load_report import LoadReporter


class Engine:
    def __init__(self) -> None:
        self.state: EngineState = "loading"
        self.running = 0
        self.snapshots = 0

    def stats(self) -> EngineStats:
        self.snapshots += 1
        return EngineStats(self.state, self.running, 0, 0, 100, 0, 0, 0, 0.0, capacity=4)


def test_a_lifecycle_change_is_told_at_once_and_counters_within_the_reports_age():
    engine = Engine()
    reporter = LoadReporter(engine, max_age_s=3600.0)  # no report would age out within the test
    assert reporter.current()[0].state == "loading"
    engine.state = "ready"  # the model finished loading: the next response says so
    report, header = reporter.current()
    assert report.state == "ready" and "ready" in header
    engine.running = 3  # a count changes within the report's age: the snapshot is reused
    assert reporter.current()[0].running == 0
    assert engine.snapshots == 2
    engine.state = "failed"
    assert reporter.current()[0] == reporter.current()[0]
    assert reporter.current()[0].state == "failed" and reporter.current()[0].running == 3
    assert engine.snapshots == 3
