"""``nearshore bench faults``: its verdict on an answer (pure), and a small run through our edge."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.faults.cases import (
    BY_NAME,
    EXPECTED_TEXT,
    TOKENS,
    Observation,
    classify,
    pick,
    read_stream,
    retry_after_s,
)
from harness.standins.hostile_answers import WORD

DEADLINE_S = 30.0


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(text: str, finish: str | None = None) -> bytes:
    return _event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})


def _stream(tokens: int = TOKENS, *, done: bool = True, extra: bytes = b"") -> bytes:
    body = _event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    body += b"".join(_chunk(WORD) for _ in range(tokens)) + extra
    body += _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    return body + (b"data: [DONE]\n\n" if done else b"")


def _unary(text: str = EXPECTED_TEXT) -> bytes:
    return json.dumps(
        {"choices": [{"index": 0, "message": {"content": text}, "finish_reason": "length"}]}
    ).encode()


def _error(status_code: str, message: str = "no") -> bytes:
    return json.dumps({"error": {"message": message, "type": "x", "code": status_code}}).encode()


def verdict(case: str, obs: Observation) -> tuple[str, str]:
    v = classify(BY_NAME[case], obs, DEADLINE_S)
    return v.outcome, v.detail


def test_a_whole_stream_and_a_whole_body_are_rescues():
    assert verdict("503", Observation(True, 200, _stream(), 0.1))[0] == "rescued"
    assert verdict("503", Observation(False, 200, _unary(), 0.1))[0] == "rescued"
    with_comments = b": heartbeat\n\n" + _stream().replace(b"\n\n", b"\r\n\r\n")
    assert verdict("stall", Observation(True, 200, with_comments, 6.0))[0] == "rescued"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_stream(40, done=False), "40/60 tokens"),
        (_stream(done=False), "no [DONE]"),
        (_stream(extra=_event({"error": {"message": "cut", "code": "upstream_unavailable"}})), "error event"),
        (_stream(extra=b"data: {not json\n\n"), "bad event"),
    ],
)
def test_a_stream_that_is_short_unfinished_or_broken_is_a_failure_presented_as_success(body: bytes, why: str):
    outcome, detail = verdict("cut", Observation(True, 200, body, 0.1))
    assert outcome == "failed" and why in detail


def test_a_body_that_is_short_or_no_completion_fails():
    assert verdict("cut", Observation(False, 200, _unary(WORD * 40), 0.1)) == ("failed", "200, 40/60 tokens")
    assert verdict("malformed", Observation(False, 200, b"{not json", 0.1))[0] == "failed"


def test_a_5xx_where_the_fallback_could_answer_fails():
    assert verdict("503", Observation(True, 503, _error("upstream_unavailable"), 0.1)) == (
        "failed",
        "503 upstream_unavailable",
    )


def test_the_content_filter_passed_on_is_advice_and_an_answer_to_it_is_not():
    assert verdict("filter", Observation(True, 400, _error("content_filter"), 0.1)) == (
        "advisory",
        "400 content_filter",
    )
    outcome, detail = verdict("filter", Observation(True, 200, _stream(), 0.1))
    assert outcome == "failed" and "refused" in detail
    assert verdict("filter", Observation(True, 400, b"<html>no</html>", 0.1))[0] == "failed"  # untyped


def test_a_429_is_advice_only_with_a_retry_after_a_client_can_honour():
    limited = _error("rate_limit_exceeded")
    assert verdict("429", Observation(True, 429, limited, 0.1, retry_after="1"))[0] == "advisory"
    assert verdict("429", Observation(True, 429, limited, 0.1))[0] == "failed"
    assert verdict("429", Observation(True, 429, limited, 0.1, retry_after="3600"))[0] == "failed"
    assert verdict("429-bare", Observation(True, 429, limited, 0.1, retry_after="1"))[0] == "failed"


def test_no_answer_and_an_answer_past_the_deadline_fail():
    outcome, detail = verdict("silence", Observation(True, None, b"", 60.0, broke="TimeoutError"))
    assert outcome == "failed" and "TimeoutError" in detail
    outcome, detail = verdict("slow-first", Observation(True, 200, _stream(), 45.0))
    assert outcome == "failed" and "deadline" in detail
    outcome, detail = verdict("stall", Observation(True, 200, _stream(20, done=False), 60.0, broke="Timeout"))
    assert outcome == "failed"


def test_retry_after_reads_seconds_and_dates():
    assert retry_after_s("2") == 2.0 and retry_after_s(" 0.5 ") == 0.5
    assert retry_after_s("Thu, 01 Jan 1970 00:01:40 GMT", now=90.0) == pytest.approx(10.0)
    assert retry_after_s("soon") is None and retry_after_s(None) is None


def test_read_stream_counts_what_an_sdk_would_see():
    read = read_stream(_stream(3) + b"data: [DONE]\n\n")
    assert (read.text, read.content_events, read.done, read.after_done) == (WORD * 3, 3, True, 1)


def test_cases_are_picked_by_name_in_the_tables_order():
    assert [c.name for c in pick("cut,503")] == ["503", "cut"]
    assert len(pick("all")) == len(BY_NAME)
    with pytest.raises(ValueError, match="unknown cases nope"):
        pick("503,nope")


@pytest.mark.slow
def test_a_few_cases_through_our_edge(tmp_path: Path):
    from bench.faults import run as faults
    from cli.bench import add_faults_arguments

    parser = argparse.ArgumentParser()
    add_faults_arguments(parser)
    cases = "503,no-done,filter,four,per-model"  # (the last two: a gateway each, of another layout)
    args = parser.parse_args(["--cases", cases, "--repeats", "2", "--logs", str(tmp_path)])
    (edge,) = faults.run(faults.FaultsBench(args.litellm, args.cases, args.repeats, args.logs))
    assert not edge.error
    outcomes = {(r.case.name, r.stream): {v.outcome for v in r.verdicts} for r in edge.results}
    assert outcomes == {
        ("503", True): {"rescued"},
        ("503", False): {"rescued"},
        ("no-done", True): {"rescued"},
        ("filter", True): {"advisory"},
        ("filter", False): {"advisory"},
        ("four", True): {"rescued"},
        ("four", False): {"rescued"},
        ("per-model", True): {"rescued"},
    }
    by_case = {(r.case.name, r.stream): r for r in edge.results}
    assert by_case[("503", True)].attempts["c"] == 2  # each answer came from the fallback
    assert by_case[("filter", True)].attempts["c"] == 0  # the filter's refusal never went to the fallback
    # Four replicas of the model failing leave the fallback its turn; the second model's failures on the
    # primaries open its own circuits though the first model is served there between them (its 12
    # answers): 3 failures each, and a probe or two once the circuits half-open.
    assert by_case[("four", True)].attempts["c"] == 2
    per_model = by_case[("per-model", True)].attempts
    assert per_model["c"] == 12 and per_model["a"] + per_model["b"] <= 12 + 2 * 3 + 4, per_model
