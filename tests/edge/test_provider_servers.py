"""A server nobody on the team wrote, as a provider behind a real edge (issue 32): llama-cpp-python's own
OpenAI server on the embedded model, requiring a key, which the edge reads from a file and sends under the
provider's own model id. The official openai client through the edge's TLS: a chat, a stream, a ledger row;
a rotated key file is read again, a wrong key fails over cleanly; the key is in no log, metric or error."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from bench import peers
from tests.conftest import MODEL, Node
from tests.edge_fixtures import Edge, prices_with, start_edge
from tests.provider_servers import SECRET, THEIR_MODEL, client_of, llama_cpp_server
from tests.tool_calls_shared import WEATHER_TOOL

pytestmark = pytest.mark.slow
PARTNER_PRICE = {"input": 0.5, "output": 1.5}  # USD per million tokens, the provider's own for MODEL


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama_cpp.server on the embedded model, answering only with its key."""
    process, url = llama_cpp_server(tmp_path_factory.mktemp("llama-cpp-server"), SECRET)
    yield url
    process.stop()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, provider: str) -> Iterator[tuple[Edge, Path]]:
    folder = tmp_path_factory.mktemp("provider-edge")
    key_file = folder / "provider.key"
    key_file.write_text(SECRET + "\n")
    partner = {
        "name": "partner",
        "url": provider,
        "city": "london",
        "provider": {
            "api_key_file": str(key_file),
            "models": {MODEL: THEIR_MODEL},
            "schema_as": "json_object",
        },
    }
    prices = prices_with({f"{MODEL}@partner": PARTNER_PRICE})
    e = start_edge(folder / "edge", [partner], upstream={"health_interval_s": 1.0}, prices=prices)
    yield e, key_file
    e.stop()


def streamed(client: openai.OpenAI, max_tokens: int) -> tuple[list[str], set[str], object]:
    """One streamed chat with its usage chunk: the content pieces, the model names, the usage."""
    pieces, models, usage = [], set(), None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        pieces += [c.delta.content for c in chunk.choices if c.delta.content]
        models.add(chunk.model)
        usage = chunk.usage or usage
    return pieces, models, usage


def test_the_official_client_chats_and_streams_through_the_edge_with_the_providers_key(edge):
    e, _ = edge
    client = client_of(e, e.new_key(tenant="acme"))
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=8, temperature=0
    )
    assert answer.choices[0].message.content and answer.usage.completion_tokens >= 1
    assert answer.model == MODEL  # the edge's name, not the provider's id (THEIR_MODEL)
    pieces, models, _ = streamed(client, max_tokens=8)
    assert "".join(pieces).strip() and models == {MODEL}
    rows = [r for r in e.ledger_rows_once(2) if r["tenant"] == "acme"]
    assert [(r["region"], r["status"]) for r in rows] == [("partner", "ok"), ("partner", "ok")]
    for r in rows:  # each at the provider's own price for the model
        assert r["completion_tokens"] >= 1 and r["prompt_tokens"] >= 1
        cost = (
            r["prompt_tokens"] * PARTNER_PRICE["input"] + r["completion_tokens"] * PARTNER_PRICE["output"]
        ) / 1e6
        assert r["cost_usd"] == pytest.approx(cost)


def responses_through(client: openai.OpenAI) -> int:
    """The Responses API's cases through an edge in front of a third-party server, which the edge asks in
    chat completions: unary with instructions, streamed, a forced tool call continued with its output
    (previous_response_id), a json_schema format, retrieve and delete. Returns the requests billed."""
    first = client.responses.create(
        model=MODEL, instructions="Be brief.", input="Name a fruit.", max_output_tokens=8, temperature=0
    )
    assert first.output_text and first.model == MODEL and first.usage.output_tokens >= 1
    events = list(
        client.responses.create(model=MODEL, input="Name a city.", max_output_tokens=8, stream=True)
    )
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == events[-1].response.output_text
    called = list(
        client.responses.create(
            model=MODEL,
            input="Weather in Lagos?",
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=60,
            temperature=0,  # sampled, llama_cpp.server may end a call's JSON early and call it whole
            stream=True,
        )
    )
    [call] = [o for o in called[-1].response.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=called[-1].response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "31 C"}],
        max_output_tokens=8,
    )
    items = client.responses.input_items.list(answer.id, order="asc").data
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    }
    shaped = client.responses.create(
        model=MODEL,
        input="The capital of France, in JSON.",
        text={"format": {"type": "json_schema", "name": "capital", "schema": schema}},
        max_output_tokens=40,
        temperature=0,
    )
    assert isinstance(json.loads(shaped.output_text)["city"], str)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    return 5


def test_the_responses_api_through_the_edge_in_front_of_llama_cpp_server(edge):
    e, _ = edge
    before = len(e.ledger_rows())
    billed = responses_through(client_of(e, e.new_key(tenant="agents")))
    rows = e.ledger_rows_once(before + billed)[before:]
    assert [(r["region"], r["status"]) for r in rows] == [("partner", "ok")] * billed
    for r in rows:  # at the provider's own price, as chat is
        cost = (
            r["prompt_tokens"] * PARTNER_PRICE["input"] + r["completion_tokens"] * PARTNER_PRICE["output"]
        ) / 1e6
        assert r["cost_usd"] == pytest.approx(cost)


def test_a_wrong_key_fails_cleanly_and_the_rotated_file_is_read_again(edge):
    e, key_file = edge
    client = client_of(e, e.new_key(tenant="rotation"))
    key_file.write_text("sk-wrong-key-000\n")
    deadline = time.monotonic() + 30
    while True:  # the file is checked at most once a second
        try:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
            )
        except openai.APIStatusError as exc:
            assert exc.status_code == 503
            assert "sk-wrong-key-000" not in exc.response.text and SECRET not in exc.response.text
            break
        assert time.monotonic() < deadline, "the wrong key was never used"
        time.sleep(0.2)
    key_file.write_text(SECRET + "\n")
    deadline = time.monotonic() + 30
    while True:  # the right key again: the probe brings the provider back, requests go through
        try:
            answer = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
            break
        except openai.APIStatusError:
            assert time.monotonic() < deadline, "the rotated key was never read"
            time.sleep(0.2)
    assert answer.choices[0].message.content is not None
    log, *served = _shown(e)
    assert all(SECRET not in text and "sk-wrong-key-000" not in text for text in (log, *served))
    assert "credential" in log  # the wrong key's refusal was logged, by what it was, not its value


def test_the_key_is_in_no_log_metric_or_health(edge):
    e, _ = edge
    assert all(SECRET not in text and "sk-wrong-key-000" not in text for text in _shown(e))


def _shown(e: Edge) -> list[str]:
    """What the edge shows: its log, then its metrics and its health as served."""
    seen = [(e.folder / "edge.log").read_text()]
    for path in ("/metrics", "/health"):
        with urllib.request.urlopen(e.metrics_url + path, timeout=10) as r:
            seen.append(r.read().decode())
    return seen


def test_a_provider_refusing_the_edges_key_fails_over_to_the_next_region(
    tmp_path: Path, provider: str, region: Node
):
    wrong = tmp_path / "wrong.key"
    wrong.write_text("sk-revoked-by-the-provider\n")
    regions = [
        {"name": "partner", "url": provider, "city": "london", "provider": {"api_key_file": str(wrong)}},
        {"name": "ours", "url": region.url, "city": "johannesburg"},
    ]
    e = start_edge(tmp_path / "edge", regions, geo={"city": "lagos"})
    try:
        client = client_of(e, e.new_key(tenant="failover"))
        answer = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert answer.headers["x-nearshore-region"] == "ours"
        [row] = e.ledger_rows_once(1)
        assert (row["region"], row["status"]) == ("ours", "ok")
        log = (e.folder / "edge.log").read_text()
        assert "sk-revoked-by-the-provider" not in log
    finally:
        e.stop()


def test_a_provider_that_does_not_report_usage_is_billed_the_edges_own_count(tmp_path: Path, provider: str):
    key_file = tmp_path / "provider.key"
    key_file.write_text(SECRET)
    partner = {
        "name": "partner",
        "url": provider,
        "provider": {"api_key_file": str(key_file), "models": {MODEL: THEIR_MODEL}, "reports_usage": False},
    }
    e = start_edge(tmp_path / "edge", [partner])
    try:
        client = client_of(e, e.new_key(tenant="counted"))
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=6, temperature=0
        )
        pieces, _, usage = streamed(client, max_tokens=6)
        unary, stream_row = e.ledger_rows_once(2)
        # What the client is told is what it is billed: the edge's count, not the provider's figure.
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (
            unary["prompt_tokens"],
            unary["completion_tokens"],
        )
        assert usage is not None and usage.completion_tokens == len(pieces) == stream_row["completion_tokens"]
        assert usage.prompt_tokens == stream_row["prompt_tokens"] >= 1
        log = (e.folder / "edge.log").read_text()
        assert "reported usage" not in log  # nothing was claimed, so nothing is an anomaly
    finally:
        e.stop()


@pytest.fixture(scope="module")
def litellm(tmp_path_factory: pytest.TempPathFactory, provider: str) -> Iterator[peers.Endpoint]:
    """LiteLLM's proxy (`make test` installs it in .venv-litellm) in front of the same llama_cpp.server,
    serving MODEL by that name, requiring its own master key."""
    binary = peers.find_litellm(".venv-litellm/bin/litellm")
    assert binary is not None, "LiteLLM's proxy is not installed: make test installs it (.venv-litellm)"
    proxy = peers.start_litellm(
        tmp_path_factory.mktemp("litellm"), binary, provider, upstream_model=THEIR_MODEL, upstream_key=SECRET
    )
    yield proxy
    proxy.process.stop()


def test_a_second_third_party_server_takes_over_from_a_provider_that_refuses_the_edges_key(
    tmp_path: Path, provider: str, litellm: peers.Endpoint, monkeypatch: pytest.MonkeyPatch
):
    """Two servers nobody on the team wrote: llama_cpp.server (with a revoked key) and LiteLLM's proxy (its
    master key from the edge's environment). The client is served by LiteLLM, at its price."""
    master_key = litellm.headers["Authorization"].removeprefix("Bearer ")
    monkeypatch.setenv("LITELLM_MASTER_KEY_FOR_EDGE", master_key)  # the edge inherits it
    revoked = tmp_path / "revoked.key"
    revoked.write_text("sk-revoked-000\n")
    regions = [
        {
            "name": "llamacpp",
            "url": provider,
            "city": "london",
            "provider": {"api_key_file": str(revoked), "models": {MODEL: THEIR_MODEL}},
        },
        {
            "name": "litellm",
            "url": litellm.url,
            "city": "johannesburg",
            # LiteLLM passes the format on to its llama_cpp.server, which takes a schema only this way
            "provider": {"api_key_env": "LITELLM_MASTER_KEY_FOR_EDGE", "schema_as": "json_object"},
        },
    ]
    prices = prices_with({f"{MODEL}@litellm": {"input": 2.0, "output": 4.0}})
    e = start_edge(tmp_path / "edge", regions, geo={"city": "lagos"}, prices=prices)
    try:
        client = client_of(e, e.new_key(tenant="two-providers"))
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=6, temperature=0
        )
        answer = raw.parse()
        assert raw.headers["x-nearshore-region"] == "litellm" and answer.model == MODEL
        pieces, _, _ = streamed(client, max_tokens=6)
        assert "".join(pieces).strip()
        billed = 2 + responses_through(client)
        rows = e.ledger_rows_once(billed)
        assert [(r["region"], r["status"]) for r in rows] == [("litellm", "ok")] * billed
        unary = rows[0]
        cost = (unary["prompt_tokens"] * 2.0 + unary["completion_tokens"] * 4.0) / 1e6
        assert unary["cost_usd"] == pytest.approx(cost)
        log = (e.folder / "edge.log").read_text()
        assert master_key not in log and "sk-revoked-000" not in log
    finally:
        e.stop()
