"""JSON request logs and W3C trace context through a real edge and a real regional node (issue 12).

One line per request at each hop, joined by the edge's request id and by the trace id; a caller's
``traceparent`` is joined when well formed, replaced when not, and never forwarded as it came.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nearshore.protocol.trace import parse_traceparent
from tests.conftest import MODEL, Node, start_region
from tests.edge_fixtures import Edge, start_edge

pytestmark = pytest.mark.slow

SMALL_ENGINE = {"max_sequences": 4, "kv_cache_tokens": 2048, "context_window": 512, "n_threads": 1}
JSON_LOGS = {"format": "json"}


@pytest.fixture(scope="module")
def hops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Edge, Node, Path]]:
    folder = tmp_path_factory.mktemp("json-logs")
    region = start_region(folder, engine=SMALL_ENGINE, logging=JSON_LOGS, embeddings={"enabled": False})
    try:
        # The base model's answers run to max_tokens: keep those in the cache (exact only: no near miss
        # of one question for another, which would keep a request from the region).
        edge = start_edge(
            folder / "edge",
            [("london", region.url)],
            logging=JSON_LOGS,
            cache={"store_truncated": True, "semantic": False},
        )
    except Exception:
        region.process.stop()
        raise
    yield edge, region, folder / "region.log"
    edge.stop()
    region.process.stop()


@dataclass
class Answer:
    status_code: int
    headers: dict[str, str]
    body: bytes


def chat(edge: Edge, key: str, headers: dict[str, str] | None = None, **body: object) -> Answer:
    payload = {
        "model": MODEL,
        # A question of its own: an earlier answer in the response cache would never reach the region.
        "messages": [{"role": "user", "content": f"Name a city in Nigeria ({os.urandom(4).hex()})."}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        **body,
    }
    request = urllib.request.Request(
        edge.url + "/v1/chat/completions",
        data=json.dumps(payload).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=60, context=edge.ssl_context()) as response:
            return Answer(
                response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
            )
    except urllib.error.HTTPError as error:
        return Answer(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def request_lines(log: Path) -> list[dict]:
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line is JSON, the startup lines too
    return [p for p in parsed if p.get("logger") == "nearshore.requests" and p.get("message") == "request"]


def line_of(log: Path, request_id: str, timeout_s: float = 10.0) -> dict:
    """The request's closing line (written just after the answer's last byte)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [line for line in request_lines(log) if line["request_id"] == request_id]
        if found:
            assert len(found) == 1, found
            return found[0]
        assert time.monotonic() < deadline, f"no log line for {request_id} in {log}"
        time.sleep(0.05)


def test_one_json_line_per_request_at_each_hop_joined_by_request_and_trace_id(hops):
    edge, _region, region_log = hops
    key = edge.new_key(tenant="acme")
    trace_id, caller_span = os.urandom(16).hex(), os.urandom(8).hex()
    response = chat(
        edge,
        key,
        {"traceparent": f"00-{trace_id}-{caller_span}-01", "tracestate": "acme=t61rcWkgMzE"},
        stream_options={"include_usage": True},
    )
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    # The response says which trace it belongs to (W3C traceresponse: the edge's span in the caller's trace).
    answered = parse_traceparent(response.headers["traceresponse"])
    assert answered is not None and answered.trace_id == trace_id

    at_edge = line_of(edge.folder / "edge.log", request_id)
    at_region = line_of(region_log, request_id)  # the edge's request id, carried to the region
    assert at_edge["trace_id"] == at_region["trace_id"] == trace_id
    # The region's parent is the edge's own span, not the caller's.
    assert at_region["parent_id"] == at_edge["span_id"] == answered.parent_id != caller_span
    assert at_region["tracestate"] == "acme=t61rcWkgMzE"
    assert at_edge["tenant"] == "acme" and at_edge["key_id"] == key.split("-")[1]
    assert at_edge["model"] == at_region["model"] == MODEL
    assert at_edge["status"] == at_region["status"] == 200
    assert at_edge["cache"] == "miss" and at_edge["region"] == "london" and at_region["region"] == "test"
    assert at_edge["completion_tokens"] == at_region["completion_tokens"] == 4
    assert at_edge["prompt_tokens"] == at_region["prompt_tokens"] > 0
    assert 0 < at_region["ttft_ms"] <= at_region["total_ms"]
    assert 0 < at_edge["ttft_ms"] <= at_edge["total_ms"]
    assert at_region["total_ms"] < at_edge["total_ms"]  # the region's time is inside the edge's
    edge.assert_no_secret_in_logs()


@pytest.mark.parametrize(
    "malformed",
    [
        "00-xyz",
        "00-" + "0" * 32 + "-" + "1" * 16 + "-01",  # all-zero trace id
        "00-" + "a" * 32 + "-" + "0" * 16 + "-01",  # all-zero parent id
        "00-" + "A" * 32 + "-" + "b" * 16 + "-01",  # uppercase
        "ff-" + "a" * 32 + "-" + "b" * 16 + "-01",  # version ff
        "00-" + "a" * 32 + "-" + "b" * 16 + "-01-extra",  # version 00 has four fields
        "00-" + "c" * 32 + "-" + "d" * 16 + "-01" + "x" * 4000,
    ],
)
def test_a_malformed_traceparent_starts_a_new_trace_and_is_never_forwarded(hops, malformed):
    edge, _region, region_log = hops
    response = chat(edge, edge.new_key(), {"traceparent": malformed, "tracestate": "evil=1"})
    assert response.status_code == 200  # served, not refused, not crashed
    request_id = response.headers["x-request-id"]
    started = parse_traceparent(response.headers["traceresponse"])
    assert started is not None and started.trace_id not in malformed
    at_edge = line_of(edge.folder / "edge.log", request_id)
    at_region = line_of(region_log, request_id)
    assert at_edge["trace_id"] == at_region["trace_id"] == started.trace_id
    assert at_region["parent_id"] == at_edge["span_id"]
    assert "tracestate" not in at_region  # a broken traceparent's tracestate is dropped with it
    assert malformed not in region_log.read_text()


def test_refused_requests_get_their_line_too(hops):
    edge, _region, _ = hops
    bad_key = "ns-000000000000-" + "x" * 43
    refused = chat(edge, bad_key)
    assert refused.status_code == 401
    invalid = chat(edge, edge.new_key(), temperature=5)
    assert invalid.status_code == 400
    limited_key = edge.new_key(rpm=1)
    assert chat(edge, limited_key).status_code == 200
    limited = chat(edge, limited_key)
    assert limited.status_code == 429
    for response, status in ((refused, 401), (invalid, 400), (limited, 429)):
        line = line_of(edge.folder / "edge.log", response.headers["x-request-id"])
        assert line["status"] == status and line["completion_tokens"] in (None, 0)
        assert line["trace_id"] and line["region"] is None
    assert "x" * 43 not in (edge.folder / "edge.log").read_text()


def test_a_cache_hit_is_logged_at_the_edge_alone(hops):
    edge, _region, region_log = hops
    key = edge.new_key()
    question = [{"role": "user", "content": "Name a river in Lagos."}]
    first = chat(edge, key, messages=question)
    for _ in range(50):  # the answer is stored just after it is sent
        again = chat(edge, key, messages=question)
        if again.headers.get("x-nearshore-cache") == "HIT":
            break
        time.sleep(0.1)
    assert first.status_code == again.status_code == 200
    assert again.headers["x-nearshore-cache"] == "HIT"
    line = line_of(edge.folder / "edge.log", again.headers["x-request-id"])
    assert line["cache"] == "exact" and line["region"] is None and line["status"] == 200
    assert line["completion_tokens"] == 4 and line["trace_id"]
    assert line_of(region_log, first.headers["x-request-id"])["status"] == 200
    assert again.headers["x-request-id"] not in region_log.read_text()  # it never crossed the ocean
