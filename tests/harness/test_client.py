"""The one streaming client (harness/client.py) and everything that reads streams through it: the
benchmarks, ``nearshore chat``, the scenarios' phase-by-phase probe and the outage scenario's outcomes."""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.chat import stream_answer
from harness.client import Stream, read_events, stream_once
from harness.launcher import RunningTopology
from harness.scenarios.probe import probe
from harness.scenarios.region_outage import Attempt, RegionOutage
from tests.edge_fixtures import Edge, edge_over_pacer, start_pacer

TOKENS = 5
CHAT = {
    "model": "gemma-3-270m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_a_stream_gives_its_server_timing_in_seconds():  # (the parser: tests/nearshore/test_server_timing.py)
    stream = Stream(server_timing_ms={"edge": 250.0})
    assert stream.server_timing_s("edge") == 0.25 and math.isnan(stream.server_timing_s("ttft"))


async def _pieces(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def test_events_split_anywhere_are_read_and_timed():
    """Events cut mid-line, CRLF framing, comments and role/usage events: only text events count."""
    body = (
        b": keep-alive\n\n"
        + _event({"choices": [{"delta": {"role": "assistant"}}]})
        + _event({"choices": [{"delta": {"content": "Hello"}}]}).replace(b"\n", b"\r\n")
        + _event({"choices": [{"text": " world"}]})
        + _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        + b"data: [DONE]\n\n"
    )
    seen: list[str] = []
    stream = Stream()
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
    await read_events(_pieces(*pieces), stream, 0.0, expected_tokens=2, on_text=seen.append)
    assert seen == ["Hello", " world"] and stream.tokens == 2 and stream.error == ""
    assert stream.usage is not None and stream.usage.completion_tokens == 2
    assert 0 < stream.ttft_s <= stream.last_token_s <= stream.e2e_s and len(stream.gaps_s) == 1


async def test_an_error_event_a_short_stream_and_a_cut_stream_are_errors():
    token = _event({"choices": [{"delta": {"content": "x"}}]})
    stream = Stream()
    await read_events(_pieces(token, b'data: {"error": {"message": "gone"}}\n\n'), stream, 0.0)
    assert stream.tokens == 1 and stream.error.startswith("error event")
    stream = Stream()
    await read_events(_pieces(token, b"data: [DONE]\n\n"), stream, 0.0, expected_tokens=3)
    assert stream.error == "1 of 3 tokens"
    stream = Stream()
    await read_events(_pieces(token), stream, 0.0)
    assert stream.error == "the stream ended without [DONE]"


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    e = edge_over_pacer(tmp_path_factory.mktemp("client"), "pacer", tokens=TOKENS, interval_ms=20)
    yield e
    e.stop()


@pytest.mark.slow
async def test_probe_times_each_phase_through_a_real_edge(edge: Edge):
    """A hand-rolled HTTPS exchange (chunked body) read by the shared client: every token, in order."""
    auth = {"Authorization": f"Bearer {edge.new_key()}"}
    phases = await probe(edge.url, "/v1/chat/completions", CHAT, auth, edge.ssl_context())
    assert phases.status == 200 and phases.stream.error == ""
    assert phases.stream.tokens == TOKENS and phases.stream.region == "pacer"
    assert phases.tcp_s > 0 and phases.tls_s > 0
    assert phases.first_token_s >= 0.02  # the pacer's first token takes one interval
    assert "edge" in phases.server_timing and phases.ttft_s > phases.first_token_s


@pytest.mark.slow
async def test_chat_prints_the_answer_as_it_streams(edge: Edge):
    running = RunningTopology(
        name="test",
        run_dir="",
        edge_url=edge.url,
        edge_local_url=edge.url,
        api_key=edge.new_key(),
        edge_ca=str(edge.ca),
        cluster_ca="",
        client_cert="",
        client_key="",
        control_url="",
    )
    out = io.StringIO()
    assert await stream_answer(running, "hi", max_tokens=TOKENS, out=out) == 0
    text = out.getvalue()
    assert text.startswith(" token" * TOKENS)
    assert "[served by pacer; first token after" in text and f"{TOKENS} tokens in" in text
    assert "[Server-Timing: " in text and "edge;dur=" in text


@pytest.mark.slow
async def test_outage_outcomes_from_real_streams(tmp_path: Path):
    """The outage scenario's verdict per request: served, failed before its first token, cut mid-stream."""
    ok = start_pacer(tmp_path, "ok", tokens=3, interval_ms=1)
    failing = start_pacer(tmp_path, "failing", fail_status=503)
    breaking = start_pacer(tmp_path, "breaking", tokens=10, interval_ms=1, break_after=2)
    try:
        body = json.dumps(CHAT).encode()
        headers = {"Content-Type": "application/json"}
        outcomes = {}
        async with aiohttp.ClientSession() as session:
            for pacer in (ok, failing, breaking):
                attempt = Attempt(time.perf_counter())
                await RegionOutage._one(session, pacer.url, body, headers, attempt)
                outcomes[pacer.process.name] = attempt.outcome
            direct = await stream_once(session, ok.url + "/v1/chat/completions", body, headers, Stream())
        assert outcomes == {
            "ok": "ok",
            "failing": "failed-before-first-byte",
            "breaking": "failed-mid-stream",
        }
        assert direct.error == "" and direct.tokens == 3 and direct.usage is not None
    finally:
        for pacer in (ok, failing, breaking):
            pacer.process.stop()
