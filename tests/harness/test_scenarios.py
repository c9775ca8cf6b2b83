"""The routing scenarios (issue 9): their figures on made-up traffic, and degraded-link and region-outage run
from the CLI on the real Lagos topology (three regional nodes on the embedded model, emulated links, an
edge), shortened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.scenarios import SCENARIOS
from harness.scenarios.traffic import (
    CUT_MID_STREAM,
    FAILED_BEFORE_FIRST_BYTE,
    OK,
    Attempt,
    flaps,
    moved_after_s,
    per_region,
    percentile_ms,
)

ROOT = Path(__file__).resolve().parents[2]


def _attempts(*served: tuple[float, str], outcome: str = OK) -> list[Attempt]:
    return [Attempt(started=t, region=r, outcome=outcome) for t, r in served]


def test_moved_is_the_first_request_after_the_last_one_in_the_wrong_place():
    traffic = _attempts((10.2, "london"), (10.5, "london"), (11.0, "johannesburg"), (11.4, "johannesburg"))
    assert moved_after_s(traffic, 10.0, lambda r: r != "london") == pytest.approx(1.0)
    # A request back in the wrong place later resets it: traffic was not there for good until after it.
    traffic += _attempts((12.0, "london"), (12.5, "virginia"))
    assert moved_after_s(traffic, 10.0, lambda r: r != "london") == pytest.approx(2.5)
    # Never got there; and already there from the first request.
    assert moved_after_s(_attempts((10.1, "london")), 10.0, lambda r: r != "london") is None
    assert moved_after_s(_attempts((10.1, "virginia")), 10.0, lambda r: r != "london") == pytest.approx(0.1)
    # An exploration after traffic came back (one request to measure a stale region) does not undo the move.
    explored = Attempt(started=13.0, region="london", outcome=OK, route="london score=1ms; explored")
    assert moved_after_s([*traffic, explored], 10.0, lambda r: r != "london") == pytest.approx(2.5)


def test_requests_that_failed_before_their_first_byte_were_served_nowhere():
    traffic = _attempts((1.0, "london"), (2.0, "johannesburg"))
    traffic += _attempts((3.0, "london"), outcome=FAILED_BEFORE_FIRST_BYTE)
    traffic += _attempts((4.0, "johannesburg"), outcome=CUT_MID_STREAM)
    assert per_region(traffic) == {"johannesburg": 2, "london": 1}
    assert moved_after_s(traffic, 0.0, lambda r: r != "london") == pytest.approx(2.0)
    assert flaps("johannesburg", traffic) == 2  # j -> l -> j: two changes, none needed


def test_flaps_are_region_changes_beyond_the_one_a_phase_needs():
    steady = _attempts((1.0, "johannesburg"), (2.0, "johannesburg"))
    assert flaps("london", steady) == 0  # one change, and it was needed
    assert flaps("johannesburg", steady) == 0
    back_and_forth = _attempts((1.0, "johannesburg"), (2.0, "london"), (3.0, "johannesburg"))
    assert flaps("london", back_and_forth) == 2
    # Counted in the order the requests were sent, not the order they are listed.
    assert flaps("london", list(reversed(steady + _attempts((0.5, "virginia"))))) == 1
    assert flaps("", []) == 0
    # An exploration (one request sent to measure a stale region again) is not traffic moving.
    explored = Attempt(started=1.5, region="virginia", outcome=OK, route="london score=1ms; explored")
    assert flaps("london", [*steady, explored]) == 0
    assert flaps("johannesburg", sorted([*steady, explored], key=lambda a: a.started)) == 0


def test_percentiles_in_milliseconds_by_the_one_definition():
    values = [0.1, 0.2, 0.3, 0.4]
    assert percentile_ms(values, 50) == pytest.approx(250)
    assert percentile_ms(values, 95) == pytest.approx(385)
    assert percentile_ms([], 50) != percentile_ms([], 50)  # NaN


def test_every_scenario_says_how_often_the_edge_probes():
    assert set(SCENARIOS) >= {"lagos-ttft", "region-outage", "degraded-link"}
    assert SCENARIOS["degraded-link"].health_interval_s <= 1.0
    assert SCENARIOS["region-outage"].health_interval_s <= 1.0


def _as_sent(attempts: list[dict], scores: bool = False) -> list[str]:
    """One short line per request of a scenario's JSON: when, where, TTFT, outcome, the route's flags (and
    with ``scores``, its region's and runner-up's scores)."""
    lines = []
    for a in attempts:
        parts = a["route"].split("; ")
        flags = [f for f in parts if " score=" not in f and not f.startswith("runner-up")]
        flags += [f.split(" rtt=")[0] for f in parts if scores and " score=" in f]
        lines.append(f"{a['t_s']:.2f}s {a['region']} {a['ttft_ms']}ms {a['outcome']} {flags}")
    return lines


def _scenario(name: str, out: Path, *args: str, timeout_s: float) -> dict:
    """The scenario's figures; one that hangs fails at ``timeout_s`` (no bound on how long it takes: a busy
    machine stretches every phase)."""
    result = subprocess.run(
        [sys.executable, "-m", "nearshore", "scenario", name, "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (out / f"{name}.png").stat().st_size > 10_000
    return json.loads((out / f"{name}.json").read_text())["data"]


def test_an_unknown_phase_is_refused_naming_the_flag(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "nearshore", "scenario", "degraded-link", "--phases", "spike,eclipse"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "--phases" in result.stderr and "eclipse" in result.stderr


@pytest.mark.slow
def test_degraded_link_moves_traffic_away_from_london_and_back(tmp_path):
    """A +200 ms spike on Lagos-London sends new requests elsewhere within seconds; once the link is itself
    again they come back; nothing fails before its first byte and nothing flaps."""
    data = _scenario(
        "degraded-link", tmp_path, "--phase-s", "3", "--phases", "baseline,spike,calm", timeout_s=150
    )
    baseline, spike, calm = data["phases"]
    assert data["target"] == "london"
    assert list(baseline["per_region"]) == ["london"], baseline
    # Away during the spike, within seconds (one probe to see it, hold_s to be sure), and staying away.
    assert spike["moved_s"] is not None and spike["moved_s"] < 10, spike
    assert set(spike["per_region"]) - {"london"}, spike
    # Back once the link recovered (the round-trip average must come down first), and staying there.
    assert calm["moved_s"] is not None, calm
    last = [a for a in data["attempts"] if a["outcome"] != FAILED_BEFORE_FIRST_BYTE][-3:]
    assert {a["region"] for a in last} == {"london"}, last
    assert data["failed_before_first_byte"] == 0, data["phases"]
    # Each request as it went (when, where, its TTFT, the route's flags), so that a flap says why.
    assert data["flaps"] == 0, (data["phases"], _as_sent(data["attempts"]))


@pytest.mark.slow
def test_region_outage_takes_the_dead_region_out_and_lets_it_back_in(tmp_path):
    """London is killed under load and restarted: the edge takes it out within seconds, no request that had
    not started fails, and once the node is back the edge routes to it again."""
    data = _scenario("region-outage", tmp_path, "--phase-s", "2", timeout_s=150)
    assert data["victim"] == "london"
    assert data["failed_before_first_byte"] == 0, data["phases"]
    assert data["ejected_after_s"] is not None and data["ejected_after_s"] < 5, data
    assert data["moved_after_s"] is not None and data["moved_after_s"] < 5, data
    after_kill = data["phases"][1]["per_region"]
    assert after_kill and "london" not in after_kill, data["phases"]
    assert data["routable_again_after_s"] is not None, data
    # Each request as it went, so that traffic kept away says why (the route's scores and flags).
    assert data["traffic_back_after_s"] is not None, _as_sent(data["attempts"], scores=True)
    # Every stream under way at the kill either finished (continued elsewhere) or was counted as cut.
    assert data["continued"] + data["cut_mid_stream"] == data["in_flight_at_kill"]


@pytest.mark.slow
def test_cable_cut_answers_from_lagos_and_goes_back_across_the_ocean(tmp_path):
    """Every ocean link down under load: the chat (the small model) answered by the Lagos-local region, the
    repeated questions by the cache, a new question for the large model refused at once with a 503; the
    links back: the chat on London's small node again; a ledger row for every request."""
    data = _scenario("cable-cut", tmp_path, "--phase-s", "3", timeout_s=300)
    baseline, cut, restore = data["phases"]
    assert (data["home"], data["local"]) == ("london-small", ["lagos-local"])
    chat, repeat, large = (baseline["by_kind"][k] for k in ("chat", "repeat", "large"))
    assert chat["remote"] > 0 and chat["local"] == 0, baseline  # the local region stands by
    assert repeat["cache"] > 0 and large["remote"] > 0, baseline
    chat, repeat, large = (cut["by_kind"][k] for k in ("chat", "repeat", "large"))
    assert chat["local"] > 0 and chat["remote"] == chat["failed"] == chat["refused"] == 0, cut
    assert repeat["cache"] > 0 and repeat["remote"] == repeat["failed"] == 0, cut
    assert large["refused"] > 0 and large["remote"] == large["local"] == 0, cut
    assert data["detect_s"] is not None and data["detect_s"] < 10, data
    assert data["first_local_s"] is not None and data["first_local_s"] < 10, data
    assert restore["by_kind"]["chat"]["remote"] > 0 and data["back_s"] is not None, restore
    # The chat streaming when the cables went (the scenario starts one) finished on the local model.
    assert 1 <= data["continued_on_local"] <= data["in_flight_at_cut"], data
    assert data["ledger_rows"] == data["sent"], data
