"""The edge in front of three misbehaving replicas (``nearshore hostile``'s provider faults): fallback models,
Retry-After, backoff, bounded attempts, one deadline per job, streams that end well, skipped bad events, and a
circuit that opens during an outage and closes after it (issue 18).

Replicas ``a`` and ``b`` serve MODEL; ``c`` serves only SMALL, MODEL's configured fallback. The fault each
replica shows is picked per request (``user: mode:a=503,b=503,c=ok``) or for a while (``POST /_control``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.edge_fixtures import Edge, Pacer, start_edge, start_hostile

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
SMALL = "small-model"
TOKENS = 6
PRICES = {MODEL: {"input": 1.0, "output": 2.0}, SMALL: {"input": 0.1, "output": 0.2}}
UPSTREAM = {
    "ttft_timeout_s": 1.5,
    "stall_timeout_s": 1.0,
    "request_deadline_s": 4.0,
    "max_retry_wait_s": 2.0,
    "retry_backoff_s": 0.2,
    "retry_backoff_max_s": 1.0,
    "heartbeat_s": 5.0,
    "health_interval_s": 60.0,
    "max_attempts": 4,
}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Pacer]]:
    folder = tmp_path_factory.mktemp("replicas")
    started = {name: start_hostile(folder, name=name, limit_s=30, tokens=TOKENS) for name in "abc"}
    yield started
    for replica in started.values():
        replica.process.stop()


def edge_over(tmp_path: Path, replicas: dict[str, Pacer], **sections: dict) -> Edge:
    regions = [
        {"name": "a", "url": replicas["a"].url, "models": [MODEL]},
        {"name": "b", "url": replicas["b"].url, "models": [MODEL]},
        {"name": "c", "url": replicas["c"].url, "models": [SMALL]},
    ]
    return start_edge(
        tmp_path / "edge",
        regions,
        top={"models": [MODEL, SMALL], "prices": PRICES},
        upstream={**UPSTREAM, **sections.pop("upstream", {})},
        cache={"enabled": False},
        fallbacks={"models": {MODEL: [SMALL]}, "context": {MODEL: [SMALL]}, **sections.pop("fallbacks", {})},
        **sections,
    )


@pytest.fixture
def edge(tmp_path: Path, replicas: dict[str, Pacer]) -> Iterator[Edge]:
    e = edge_over(tmp_path, replicas)
    yield e
    e.stop()


@pytest.fixture(autouse=True)
def fresh_logs(replicas: dict[str, Pacer]) -> None:
    async def clear() -> None:
        async with aiohttp.ClientSession() as s:
            for replica in replicas.values():
                async with s.delete(replica.url + "/_log") as r:
                    assert r.status == 200
                async with s.post(replica.url + "/_control", json={"mode": None}) as r:
                    assert r.status == 200

    asyncio.run(clear())


class Answer:
    def __init__(self, status: int, body: bytes, headers: dict, client_id: str, seconds: float) -> None:
        self.status, self.body, self.headers, self.client_id, self.seconds = (
            status,
            body,
            headers,
            client_id,
            seconds,
        )

    def json(self) -> dict:
        return json.loads(self.body)

    def events(self) -> list[bytes]:
        return [e[6:] for e in self.body.split(b"\n\n") if e.startswith(b"data: ")]

    def text(self) -> str:
        if not self.body.startswith(b"data:") and b"\n\ndata:" not in self.body:
            return self.json()["choices"][0]["message"]["content"]
        parts = []
        for event in self.events():
            if event == b"[DONE]":
                continue
            for choice in json.loads(event).get("choices", []):
                parts.append((choice.get("delta") or {}).get("content") or "")
        return "".join(parts)


async def ask(
    edge: Edge,
    key: str,
    mode: str | None = None,
    *,
    stream: bool = True,
    headers: dict[str, str] | None = None,
    max_tokens: int = TOKENS,
) -> Answer:
    client_id = uuid.uuid4().hex
    payload: dict = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": f"hi {client_id}"}],
    }
    if stream:
        payload["stream_options"] = {"include_usage": True}
    if mode is not None:
        payload["user"] = f"mode:{mode}"
    sent = {"Authorization": f"Bearer {key}", "x-client-request-id": client_id, **(headers or {})}
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as s,
        s.post(edge.url + "/v1/chat/completions", json=payload, headers=sent) as r,
    ):
        body = await r.read()
        return Answer(r.status, body, r.headers.copy(), client_id, time.perf_counter() - started)


async def log_of(replica: Pacer) -> list[dict]:
    """The completions requests the replica received (health probes left out)."""
    async with aiohttp.ClientSession() as s, s.get(replica.url + "/_log") as r:
        requests = (await r.json())["requests"]
    return [q for q in requests if q["path"].startswith("/v1/")]


async def control(replica: Pacer, mode: str, for_s: float) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(replica.url + "/_control", json={"mode": mode, "for_s": for_s}) as r,
    ):
        assert r.status == 200, await r.text()


async def row_of(edge: Edge, client_id: str) -> dict:
    for _ in range(100):
        rows = [r for r in edge.ledger_rows() if r["client_request_id"] == client_id]
        if rows:
            assert len(rows) == 1, rows
            return rows[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no ledger row for {client_id}")


def scrape(edge: Edge) -> str:
    import urllib.request

    with urllib.request.urlopen(edge.metrics_url + "/metrics", timeout=5) as r:
        return r.read().decode()


# --- fallback models -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_a_fallback_model_answers_when_every_replica_refuses_and_is_named_and_billed(
    edge: Edge, replicas: dict[str, Pacer], stream: bool
):
    key = edge.new_key()
    answer = await ask(edge, key, "a=503,b=503,c=ok", stream=stream)
    assert answer.status == 200, answer.body[:300]
    assert answer.headers["x-nearshore-model"] == SMALL and answer.headers["x-nearshore-region"] == "c"
    assert answer.text()
    served = answer.json()["model"] if not stream else json.loads(answer.events()[0])["model"]
    assert served == SMALL  # the region was asked for the fallback by name
    row = await row_of(edge, answer.client_id)
    assert (row["model"], row["fallback_from"], row["region"], row["status"]) == (SMALL, MODEL, "c", "ok")
    assert row["attempts"] == 3
    # Billed once, at the fallback's price, for the fallback's usage; the two refusals cost nothing.
    expected = (row["prompt_tokens"] * 0.1 + row["completion_tokens"] * 0.2) / 1e6
    assert row["cost_usd"] == pytest.approx(expected)
    assert f'model_fallbacks_total{{model="{MODEL}",served_by="{SMALL}"}} 1.0' in scrape(edge)


async def test_a_clients_own_chain_is_taken_and_one_it_may_not_name_is_a_400(edge: Edge):
    key = edge.new_key()
    none = await ask(edge, key, "a=503,b=503,c=ok", headers={"x-nearshore-fallback": " "})
    assert none.status == 503 and none.json()["error"]["code"] == "upstream_unavailable"
    own = await ask(edge, key, "a=503,b=503,c=ok", headers={"x-nearshore-fallback": SMALL})
    assert own.status == 200 and own.headers["x-nearshore-model"] == SMALL
    wrong = await ask(edge, key, "ok", headers={"x-nearshore-fallback": "gpt-9"})
    assert wrong.status == 400 and wrong.json()["error"]["param"] == "x-nearshore-fallback"


async def test_a_context_length_refusal_goes_to_the_context_fallback_and_a_content_filter_never_does(
    edge: Edge, replicas: dict[str, Pacer]
):
    key = edge.new_key()
    longer = await ask(edge, key, "a=context-length,b=context-length,c=ok")
    assert longer.status == 200 and longer.headers["x-nearshore-model"] == SMALL
    assert len(await log_of(replicas["a"])) + len(await log_of(replicas["b"])) == 1  # one says it for all
    filtered = await ask(edge, key, "a=content-filter,b=content-filter,c=ok")
    assert filtered.status == 400 and filtered.json()["error"]["code"] == "content_filter"
    assert len(await log_of(replicas["c"])) == 1  # only the context-length request reached the fallback


# --- retries -------------------------------------------------------------------------------------------


async def test_retry_after_is_honoured_before_the_same_replica_is_asked_again(
    edge: Edge, replicas: dict[str, Pacer]
):
    key = edge.new_key()
    for name in "ab":  # both limit the rate for 0.9 s, saying "after 1 s"; no fallback for this request
        await control(replicas[name], "429:1", for_s=0.9)
    answer = await ask(edge, key, headers={"x-nearshore-fallback": ""})
    assert answer.status == 200, answer.body[:300]
    times = sorted(
        [q["t"] for q in await log_of(replicas["a"])] + [q["t"] for q in await log_of(replicas["b"])]
    )
    assert len(times) == 3  # a, b, then the first of them again
    assert times[2] - times[0] >= 0.95  # the retry waited for Retry-After
    assert answer.seconds < 8  # (no longer than the wait asked for, with room for a busy machine)


async def test_a_retry_after_longer_than_the_edge_waits_is_passed_on_as_a_429(edge: Edge):
    key = edge.new_key()
    answer = await ask(edge, key, "429:30", headers={"x-nearshore-fallback": ""})
    assert answer.status == 429 and answer.json()["error"]["code"] == "upstream_rate_limited"
    assert int(answer.headers["Retry-After"]) == 30
    assert answer.seconds < 10  # not waited on (30 s)
    again = await ask(edge, key, "ok", headers={"x-nearshore-fallback": ""})
    assert again.status == 429  # every replica asked not to be asked for 30 s: the edge does not


async def test_attempts_on_one_replica_back_off_with_jitter(edge: Edge, replicas: dict[str, Pacer]):
    key = edge.new_key()
    gaps = []
    for _ in range(3):
        tag = uuid.uuid4().hex[:8]
        mode = f"a=500-once:{tag}a,b=500-once:{tag}b"
        answer = await ask(edge, key, mode, headers={"x-nearshore-fallback": ""})
        assert answer.status == 200, answer.body[:300]
        for name in "ab":  # one of them failed once, then answered when asked again
            times = [q["t"] for q in await log_of(replicas[name]) if tag in (q["mode"] or "")]
            if len(times) == 2:
                gaps.append(times[1] - times[0])
    assert len(gaps) == 3
    # The first retry on a replica waits between half of retry_backoff_s and all of it, at random (the
    # other replica's attempt came between, so a gap is at least the wait).
    assert all(0.09 <= g <= 0.8 for g in gaps), gaps
    assert max(gaps) - min(gaps) > 0.001


async def test_attempts_are_bounded_and_failed_ones_are_not_billed(edge: Edge, replicas: dict[str, Pacer]):
    key = edge.new_key()
    answer = await ask(edge, key, "*=500-once:never-twice,a=503,b=503,c=503")
    assert answer.status == 503 and answer.json()["error"]["code"] == "upstream_unavailable"
    received = 0
    for name in "abc":
        received += len(await log_of(replicas[name]))
    assert received <= UPSTREAM["max_attempts"]
    row = await row_of(edge, answer.client_id)
    assert row["status"] == "error" and row["cost_usd"] == 0 and row["completion_tokens"] == 0
    assert row["attempts"] == received


# --- deadlines -----------------------------------------------------------------------------------------


async def test_a_slow_first_token_within_its_limit_is_waited_for_though_it_is_longer_than_a_stall(
    edge: Edge, replicas: dict[str, Pacer]
):
    key = edge.new_key()
    answer = await ask(edge, key, "*=slow-first-event:1.2")
    assert answer.status == 200 and answer.events()[-1] == b"[DONE]", answer.body[-300:]
    assert b'"error"' not in answer.body
    row = await row_of(edge, answer.client_id)
    assert row["attempts"] == 1 and row["continued_from"] == ""


async def test_a_first_token_past_its_limit_moves_the_request_to_another_replica(
    edge: Edge, replicas: dict[str, Pacer]
):
    key = edge.new_key()
    answer = await ask(
        edge, key, "a=slow-first-event:5,b=slow-first-event:5,*=ok", headers={"x-nearshore-fallback": ""}
    )
    # Both replicas of MODEL are late: each gets ttft_timeout_s; then the error, within the deadline.
    assert answer.status in (200, 504)
    assert b"no first token within 1.5s" in answer.body, answer.body[-400:]
    assert 2.8 <= answer.seconds < 8  # not 5 s per replica
    healthy = await ask(edge, key, "a=slow-first-event:5,b=ok")
    assert healthy.status == 200 and b'"error"' not in healthy.body
    assert healthy.headers.get("x-nearshore-region") in ("a", "b")
    assert len(healthy.text()) > 0


async def test_a_stall_mid_stream_is_continued_by_another_replica(edge: Edge, replicas: dict[str, Pacer]):
    key = edge.new_key()
    answer = await ask(edge, key, "a=stall-at:2:5,b=stall-at:2:5")
    # Whichever replica goes first stalls after 2 tokens; the other continues and stalls too, after 2 more;
    # two of the model's replicas failed the stream, so its fallback (c) continues it.
    assert answer.status == 200
    row = await row_of(edge, answer.client_id)
    assert row["continued_from"] in ("a", "b", "a,b", "b,a") and row["attempts"] >= 2
    assert answer.seconds < 8  # no stall is waited out (5 s each), the deadline (4 s) bounds it all


async def test_the_request_deadline_bounds_every_attempt_together(edge: Edge):
    key = edge.new_key()
    answer = await ask(edge, key, "*=slow-first-token:10")
    assert answer.status == 504 and answer.json()["error"]["code"] == "upstream_timeout"
    assert "deadline" in answer.json()["error"]["message"]
    # a, b, then the fallback c gets what is left of the 4 s: the message says the deadline ended it; the
    # time is far below one replica's own 10 s (the upper bound leaves a busy machine room: it missed 4.8 s)
    assert 3.8 <= answer.seconds < 10


# --- how streams end -----------------------------------------------------------------------------------


async def test_a_stream_that_ends_without_done_after_its_finish_reason_is_whole(edge: Edge):
    key = edge.new_key()
    answer = await ask(edge, key, "*=no-done")
    assert answer.status == 200 and answer.events()[-1] == b"[DONE]"
    assert b'"error"' not in answer.body
    assert json.loads(answer.events()[-2])["usage"]["completion_tokens"] == TOKENS
    row = await row_of(edge, answer.client_id)
    assert row["status"] == "ok" and row["continued_from"] == "" and row["completion_tokens"] == TOKENS


async def test_a_stream_cut_without_a_finish_reason_is_continued(edge: Edge, replicas: dict[str, Pacer]):
    key = edge.new_key()
    answer = await ask(edge, key, "a=cut-at:2:6,b=cut-at:2:6")
    row = await row_of(edge, answer.client_id)
    # Both of the model's replicas cut it (the second after continuing it); its fallback c finishes it.
    assert row["continued_from"] in ("a,b", "b,a") and (row["region"], row["status"]) == ("c", "ok")


async def test_a_malformed_event_is_skipped_and_counted(edge: Edge):
    key = edge.new_key()
    answer = await ask(edge, key, "*=malformed-chunk:3")
    assert answer.status == 200 and answer.events()[-1] == b"[DONE]" and b'"error"' not in answer.body
    assert len([e for e in answer.events() if b'"content"' in e]) >= TOKENS
    row = await row_of(edge, answer.client_id)
    assert row["bad_events"] == 1 and row["status"] == "ok"
    assert f'upstream_bad_events_total{{region="{row["region"]}"}} 1.0' in scrape(edge)


async def test_too_many_malformed_events_break_the_stream(tmp_path: Path, replicas: dict[str, Pacer]):
    edge = edge_over(tmp_path, replicas, upstream={"max_bad_events": 0})
    try:
        answer = await ask(edge, edge.new_key(), "*=malformed-chunk:3", headers={"x-nearshore-fallback": ""})
        assert b"did not parse" in answer.body
    finally:
        edge.stop()


# --- the circuit ---------------------------------------------------------------------------------------


async def test_an_outage_opens_the_circuit_and_its_end_closes_it(tmp_path: Path, replicas: dict[str, Pacer]):
    edge = edge_over(tmp_path, replicas, geo={"health": {"consecutive_failures": 3, "base_ejection_s": 1.5}})
    try:
        key = edge.new_key()
        await control(replicas["a"], "503", for_s=3.0)  # a is down for 3 s
        await control(replicas["b"], "503", for_s=3.0)  # and so is b
        answers = [await ask(edge, key) for _ in range(12)]
        assert all(a.status == 200 for a in answers), [a.status for a in answers]  # the fallback answers
        asked = len(await log_of(replicas["a"])) + len(await log_of(replicas["b"]))
        # Without a circuit each request would ask a and b again (24); with it, each is out after 3 refusals
        # (one more each when the ejection ends: the half-open trial).
        assert asked <= 10, asked
        await asyncio.sleep(3.2)
        back = None
        for _ in range(20):  # the outage is over: a trial request closes the circuit
            answer = await ask(edge, key)
            if answer.headers.get("x-nearshore-region") in ("a", "b"):
                back = answer
                break
            await asyncio.sleep(0.2)
        assert back is not None and back.status == 200 and "x-nearshore-model" not in back.headers
    finally:
        edge.stop()


async def test_a_size_alias_falls_back_to_its_other_model_when_no_chain_is_configured(
    tmp_path: Path, replicas: dict[str, Pacer]
):
    alias = {"name": "auto", "small": SMALL, "large": MODEL}
    edge = edge_over(tmp_path, replicas, fallbacks={"models": {}, "context": {}}, aliases=[alias])
    try:
        key = edge.new_key()
        connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
        payload = {
            "model": "auto",
            "max_tokens": TOKENS,
            "user": "mode:a=503,b=503,c=ok",
            "messages": [{"role": "user", "content": "hi"}],
        }
        headers = {"Authorization": f"Bearer {key}", "x-nearshore-size": "large"}
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.post(edge.url + "/v1/chat/completions", json=payload, headers=headers) as r,
        ):
            assert r.status == 200, await r.text()
            assert r.headers["x-nearshore-model"] == SMALL
            assert (await r.json())["model"] == SMALL
    finally:
        edge.stop()


async def test_a_stream_late_after_its_head_on_every_replica_is_answered_by_the_fallback(edge: Edge):
    key = edge.new_key()
    answer = await ask(edge, key, "a=slow-first-event:5,b=slow-first-event:5,c=ok")
    assert answer.status == 200 and b'"error"' not in answer.body, answer.body[-300:]
    assert json.loads(answer.events()[-3])["model"] == SMALL and answer.text()
    row = await row_of(edge, answer.client_id)
    assert (row["model"], row["fallback_from"], row["region"]) == (SMALL, MODEL, "c")


@pytest.mark.parametrize("fault", ["slow-first-event:5", "cut-at:3:6", "malformed-chunk:2", "stall-at:2:5"])
async def test_a_unary_answer_that_fails_after_its_head_is_asked_of_another(edge: Edge, fault: str):
    key = edge.new_key()
    answer = await ask(edge, key, f"a={fault},b={fault},c=ok", stream=False)
    assert answer.status == 200, answer.body[:300]
    assert answer.json()["model"] == SMALL and answer.text()
    row = await row_of(edge, answer.client_id)
    assert (row["model"], row["region"], row["status"]) == (SMALL, "c", "ok") and row["attempts"] == 3


async def test_a_stream_continued_to_its_last_token_is_whole_without_a_finish_reason(edge: Edge):
    key = edge.new_key()
    answer = await ask(edge, key, "a=cut-at:3:6,b=cut-at:3:6")  # 3 tokens each, max_tokens 6
    assert answer.status == 200 and b'"error"' not in answer.body, answer.body[-300:]
    assert answer.events()[-1] == b"[DONE]"
    row = await row_of(edge, answer.client_id)
    assert row["status"] == "ok" and row["continued_from"] in ("a", "b")
