"""A server nobody on the team wrote, as a provider behind a real edge (issue 32): llama-cpp-python's own
OpenAI server on the embedded model, requiring a key, which the edge reads from a file and sends under the
provider's own model id. The official openai client through the edge's TLS: a chat, a stream, a ledger row;
a rotated key file is read again, a wrong key fails over cleanly; the key is in no log, metric or error."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from bench import peers
from harness.procs import ManagedProcess, free_port
from nearshore.tls import client_context, create_cluster_ca, issue_certificate
from regional.model_store import resolve_model_path
from tests.conftest import MODEL, Node
from tests.edge_fixtures import Edge, prices_with, start_edge
from tests.tool_calls_shared import WEATHER

pytestmark = pytest.mark.slow
THEIR_MODEL = "served-gemma"  # what the provider calls the model the edge serves as MODEL
EMBEDDER = "all-minilm-l6-v2"  # the region's embedding model
SECRET = "sk-provider-4f0c9e1d2b7a"
PARTNER_PRICE = {"input": 0.5, "output": 1.5}  # USD per million tokens, the provider's own for MODEL


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama_cpp.server on the embedded model, answering only with its key."""
    folder = tmp_path_factory.mktemp("llama-cpp-server")
    port = free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(resolve_model_path(""))]
    argv += ["--model_alias", THEIR_MODEL, "--chat_format", "gemma", "--api_key", SECRET]
    # By default it ends the stream it is writing whenever another request arrives (the edge's probe too),
    # and ends it as if whole: a server that serves more than one caller must not.
    argv += ["--n_ctx", "2048", "--n_threads", "2", "--interrupt_requests", "False"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    process = ManagedProcess("llama_cpp.server", argv, folder / "server.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_http(url + "/v1/models", timeout_s=180, headers={"Authorization": f"Bearer {SECRET}"})
        yield url
    finally:
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


def client_of(edge: Edge, key: str) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(verify=edge.ssl_context())
    return openai.OpenAI(base_url=edge.url + "/v1", api_key=key, http_client=http, max_retries=0)


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
    tool = {"type": "function", **WEATHER["function"]}
    called = list(
        client.responses.create(
            model=MODEL,
            input="Weather in Lagos?",
            tools=[tool],
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


def test_the_key_is_in_no_log_metric_or_health(edge):
    e, _ = edge
    seen = [(e.folder / "edge.log").read_text()]
    for path in ("/metrics", "/health"):
        with urllib.request.urlopen(e.metrics_url + path, timeout=10) as r:
            seen.append(r.read().decode())
    assert all(SECRET not in text and "sk-wrong-key-000" not in text for text in seen)
    assert "credential" in seen[0]  # the wrong key's refusal was logged, by what it was, not its value


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


def llama_cpp_server(
    folder: Path, key: str, tls: tuple[Path, Path] | None = None, ca: Path | None = None
) -> tuple[ManagedProcess, str]:
    """Another llama_cpp.server on the embedded model; ``tls``: serving HTTPS with that certificate and key
    (``ca``: the CA that signed it, to wait for it)."""
    port = free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(resolve_model_path(""))]
    argv += ["--model_alias", THEIR_MODEL, "--chat_format", "gemma", "--api_key", key]
    argv += ["--n_ctx", "2048", "--n_threads", "2", "--interrupt_requests", "False"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    if tls is not None:
        argv += ["--ssl_certfile", str(tls[0]), "--ssl_keyfile", str(tls[1])]
    process = ManagedProcess("llama_cpp.server", argv, folder / "server.log").start()
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    context = client_context(ca) if ca is not None else None
    try:
        process.wait_http(
            url + "/v1/models", timeout_s=180, context=context, headers={"Authorization": f"Bearer {key}"}
        )
    except Exception:
        process.stop()
        raise
    return process, url


@pytest.fixture(scope="module")
def litellm_on_region(tmp_path_factory: pytest.TempPathFactory, region: Node) -> Iterator[peers.Endpoint]:
    """LiteLLM's proxy in front of a Nearshore region: its chat model and its embedding model."""
    binary = peers.find_litellm(".venv-litellm/bin/litellm")
    assert binary is not None, "LiteLLM's proxy is not installed: make test installs it (.venv-litellm)"
    folder = tmp_path_factory.mktemp("litellm-on-region")
    proxy = peers.start_litellm(folder, binary, region.url, upstream_model=MODEL, also=[EMBEDDER])
    yield proxy
    proxy.process.stop()


def test_embeddings_tools_and_the_cache_through_a_provider(
    litellm_on_region: peers.Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The official client through an edge whose only region is LiteLLM's proxy: embeddings, a forced tool
    call, and a repeated structured question answered by the edge's cache (never crossing to LiteLLM)."""
    monkeypatch.setenv("LITELLM_KEY", litellm_on_region.headers["Authorization"].removeprefix("Bearer "))
    partner = {"name": "litellm", "url": litellm_on_region.url, "provider": {"api_key_env": "LITELLM_KEY"}}
    e = start_edge(tmp_path / "edge", [partner])
    try:
        client = client_of(e, e.new_key(tenant="through-litellm"))
        vectors = client.embeddings.create(model=EMBEDDER, input=["Jollof rice", "Suya"])
        assert (
            len(vectors.data) == 2 and len(vectors.data[0].embedding) == 384 and vectors.usage.prompt_tokens
        )
        called = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Lagos?"}],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=60,
            temperature=0,
        )
        [call] = called.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)
        schema = {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        }
        asked = dict(
            model=MODEL,
            messages=[{"role": "user", "content": "The capital of Kenya, in JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}},
            max_tokens=40,
            temperature=0,
        )
        first = client.chat.completions.with_raw_response.create(**asked)
        assert first.headers["x-nearshore-cache"] == "MISS"
        for _ in range(50):  # the entry is written just after the answer, off the request's path
            again = client.chat.completions.with_raw_response.create(**asked)
            if again.headers["x-nearshore-cache"] == "HIT":
                break
            time.sleep(0.1)
        assert again.headers["x-nearshore-cache"] == "HIT"
        assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
        rows = e.ledger_rows_once(4)
        assert [r["region"] for r in rows[:3]] == ["litellm"] * 3 and rows[-1]["cache_status"] == "exact"
        assert [r["output"] for r in rows[:3]] == ["", "tools", "json_schema"]
    finally:
        e.stop()


def test_a_provider_killed_mid_stream_is_continued_on_another_and_each_billed_its_part(
    tmp_path: Path,
    litellm_on_region: peers.Endpoint,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
):
    """llama_cpp.server dies (SIGKILL) five tokens into a streamed response; LiteLLM's proxy (in front of a
    Nearshore region, which honours continue_final_message) continues the same model's answer. The client
    gets one whole response; the ledger bills the prompt and the first part at llama_cpp.server's price,
    the rest at LiteLLM's."""
    doomed, doomed_url = llama_cpp_server(tmp_path / "doomed", SECRET)
    request.addfinalizer(doomed.stop)
    rescuer = litellm_on_region
    monkeypatch.setenv("RESCUER_KEY", rescuer.headers["Authorization"].removeprefix("Bearer "))
    key_file = tmp_path / "doomed.key"
    key_file.write_text(SECRET)
    regions = [
        {
            "name": "doomed",
            "url": doomed_url,
            "city": "london",
            "provider": {"api_key_file": str(key_file), "models": {MODEL: THEIR_MODEL}},
        },
        {
            "name": "rescuer",
            "url": rescuer.url,
            "city": "virginia",
            "provider": {"api_key_env": "RESCUER_KEY", "continues_answers": True},
        },
    ]
    doomed_price, rescuer_price = {"input": 1.0, "output": 3.0}, {"input": 5.0, "output": 7.0}
    prices = prices_with({f"{MODEL}@doomed": doomed_price, f"{MODEL}@rescuer": rescuer_price})
    e = start_edge(tmp_path / "edge", regions, geo={"city": "lagos"}, prices=prices, cache={"enabled": False})
    try:
        client = client_of(e, e.new_key(tenant="rescued"))
        deltas, events = 0, []
        for event in client.responses.create(
            model=MODEL,
            input="Write three sentences about Lagos.",
            max_output_tokens=32,
            temperature=0,
            stream=True,
        ):
            events.append(event)
            if event.type == "response.output_text.delta":
                deltas += 1
                if deltas == 5:
                    doomed.proc.kill()  # no goodbye, mid-answer
        kinds = [ev.type for ev in events]
        assert "error" not in kinds and kinds[-1] in ("response.completed", "response.incomplete")
        final = events[-1].response
        text = "".join(ev.delta for ev in events if ev.type == "response.output_text.delta")
        assert text == final.output_text and deltas > 5
        [row] = e.ledger_rows_once(1)
        assert (row["status"], row["region"], row["continued_from"]) == ("ok", "rescuer", "doomed")
        first, rest = (int(part.split(":")[1]) for part in row["served_by"].split(","))
        assert row["served_by"] == f"doomed:{first},rescuer:{rest}" and first >= 5 and rest >= 1
        assert first + rest == row["completion_tokens"] == final.usage.output_tokens
        cost = row["prompt_tokens"] * doomed_price["input"] + first * doomed_price["output"]
        cost += rest * rescuer_price["output"]
        assert row["cost_usd"] == pytest.approx(cost / 1e6)
        log = (e.folder / "edge.log").read_text()
        assert SECRET not in log and rescuer.headers["Authorization"] not in log
    finally:
        e.stop()


def test_a_provider_over_https_is_trusted_through_the_systems_trust_store_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
):
    """A real TLS handshake to a provider (llama_cpp.server serving HTTPS with a certificate of a private
    CA): an edge whose system trust store lacks that CA refuses it (and says why in its log, not the
    client's answer); one whose trust store has it (SSL_CERT_FILE, OpenSSL's own) serves through it."""
    ca_cert, _ = create_cluster_ca(tmp_path / "ca", name="Partner private CA")
    tls = issue_certificate(
        tmp_path / "ca", "partner", tmp_path / "partner-tls", hosts=("127.0.0.1",), server=True
    )
    server, url = llama_cpp_server(tmp_path / "tls-server", SECRET, tls=tls, ca=ca_cert)
    request.addfinalizer(server.stop)
    key_file = tmp_path / "partner.key"
    key_file.write_text(SECRET)
    partner = {
        "name": "partner",
        "url": url,
        "provider": {"api_key_file": str(key_file), "models": {MODEL: THEIR_MODEL}},
    }
    untrusting = start_edge(tmp_path / "untrusting", [partner], upstream={"health_interval_s": 1.0})
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            client_of(untrusting, untrusting.new_key()).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
        assert caught.value.status_code == 503
        log = (untrusting.folder / "edge.log").read_text()
        assert "SSLCertVerificationError" in caught.value.body["message"]  # what failed, no secret in it
        assert "is DOWN: /v1/models failed: SSLCertVerificationError" in log and SECRET not in log
    finally:
        untrusting.stop()
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_cert))  # the edge's system trust store: this CA alone
    trusting = start_edge(tmp_path / "trusting", [partner])
    try:
        client = client_of(trusting, trusting.new_key())
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        assert answer.choices[0].message.content is not None
        assert client.responses.create(model=MODEL, input="Name a fruit.", max_output_tokens=4).output_text
        rows = trusting.ledger_rows_once(2)
        assert [(r["region"], r["status"]) for r in rows] == [("partner", "ok")] * 2
    finally:
        trusting.stop()
