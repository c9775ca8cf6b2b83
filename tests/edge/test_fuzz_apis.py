"""Property-based fuzzing of both APIs: the real region (the real model) and an edge over a pacer.

Whatever the body, the answer is never a 5xx and never a hang: a JSON error object with a 4xx, or an answer.
CI runs a few hundred cases per endpoint with a fixed seed; ``NEARSHORE_FUZZ_EXAMPLES=5000`` runs a longer,
randomised search (issue 7, "fuzzing in CI").
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Node
from tests.edge_fixtures import Edge, edge_over_pacer
from tests.fuzz_strategies import CHAT_BODY, COMPLETION_BODY, RESPONSES_BODY, Case, Client, cases

pytestmark = pytest.mark.slow

LONG_RUN = int(os.environ.get("NEARSHORE_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=LONG_RUN or 200,
    derandomize=not LONG_RUN,  # CI repeats the same cases; a long run explores
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
ENDPOINTS = {
    "/v1/chat/completions": CHAT_BODY,
    "/v1/completions": COMPLETION_BODY,
    "/v1/responses": RESPONSES_BODY,
}


def check(status: int, body: bytes, content_type: str, case: Case, path: str = "") -> None:
    shown = f"{status} {body[:300]!r} for {case}"
    assert status < 500, shown
    responses = path == "/v1/responses"
    if status >= 400:
        assert content_type.startswith("application/json"), shown
        error = json.loads(body)["error"]
        assert error["message"] and error["type"], shown
    elif content_type.startswith("text/event-stream") and responses:
        last = body.rstrip().rsplit(b"\n", 1)[-1]  # the last event's data line
        assert json.loads(last.removeprefix(b"data: "))["type"] in (
            "response.completed",
            "response.incomplete",
        ), shown
        assert b"event: error" not in body, shown  # a stream that failed after its head would hide a 5xx
    elif content_type.startswith("text/event-stream"):
        assert body.endswith(b"data: [DONE]\n\n"), shown
        assert b'data: {"error"' not in body, shown  # a stream that failed after its head would hide a 5xx
    else:
        answer = json.loads(body)
        assert answer["output"] if responses else answer["choices"], shown


@pytest.fixture(scope="module")
def fuzz_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    e = edge_over_pacer(tmp_path_factory.mktemp("fuzz"), "pacer", tokens=3, interval_ms=1)
    yield e
    e.stop()


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_fuzzed_bodies_never_5xx_the_region(region: Node, path: str):
    client = Client(region.url)

    @FUZZ
    @given(case=cases(ENDPOINTS[path]))
    def run(case: Case) -> None:
        check(*client.post(path, case, {}), case, path)

    try:
        run()
    finally:
        client.close()
    healthy = Client(region.url)
    status, _, _ = healthy.post(path, Case(json.dumps(_good(path)).encode()), {})
    healthy.close()
    assert status == 200  # still serving


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_fuzzed_bodies_never_5xx_the_edge(fuzz_edge: Edge, path: str):
    key = fuzz_edge.new_key(rpm=10**6, tpm=10**9)
    client = Client(fuzz_edge.url, fuzz_edge.ssl_context())
    auth = st.sampled_from(
        [f"Bearer {key}"] * 6 + ["", "Bearer ", f"Basic {key}", f"Bearer {key}x", "Bearer \t"]
    )

    @FUZZ
    @given(case=cases(ENDPOINTS[path]), authorization=auth)
    def run(case: Case, authorization: str) -> None:
        headers = {"Authorization": authorization} if authorization else {}
        check(*client.post(path, case, headers), case, path)

    try:
        run()
    finally:
        client.close()
    healthy = Client(fuzz_edge.url, fuzz_edge.ssl_context())
    status, _, _ = healthy.post(
        path, Case(json.dumps(_good(path)).encode()), {"Authorization": f"Bearer {key}"}
    )
    healthy.close()
    assert status == 200


def _good(path: str) -> dict:
    if path == "/v1/responses":
        return {"model": "gemma-3-270m", "input": "hi", "max_output_tokens": 2}
    if path == "/v1/completions":
        return {"model": "gemma-3-270m", "prompt": "Lagos is", "max_tokens": 2}
    return {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_broken_body_does_not_hang_the_next_request_on_its_connection(fuzz_edge: Edge, region: Node):
    """Found by the fuzzer: after a body that was not its gzip, the next request on the keep-alive
    connection hung (the bytes after the broken body were not a request)."""
    key = fuzz_edge.new_key()
    good = Case(json.dumps(_good("/v1/chat/completions")).encode())
    broken = Case(good.body, encoding="gzip")
    for client, headers in (
        (Client(fuzz_edge.url, fuzz_edge.ssl_context(), timeout_s=10), {"Authorization": f"Bearer {key}"}),
        (Client(region.url, timeout_s=10), {}),
    ):
        try:
            assert client.post("/v1/chat/completions", broken, headers)[0] == 400
            assert client.post("/v1/chat/completions", good, headers)[0] == 200
        finally:
            client.close()


def test_no_key_reached_any_log(fuzz_edge: Edge):
    """The fuzzer's keys (valid, cut, padded) against every log written: none holds a secret."""
    fuzz_edge.assert_no_secret_in_logs()
