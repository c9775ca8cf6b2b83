"""A provider's other paths (issue 32), with servers nobody on the team wrote: embeddings, a forced tool
call and the edge's cache through LiteLLM's proxy (in front of a Nearshore region); llama_cpp.server killed
mid-stream and its answer continued by that proxy, each billed its part; a provider over HTTPS, trusted only
through the system's trust store."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from bench import peers
from nearshore.tls import create_cluster_ca, issue_certificate
from tests.conftest import MODEL, Node
from tests.edge_fixtures import prices_with, start_edge
from tests.provider_servers import EMBEDDER, SECRET, THEIR_MODEL, client_of, llama_cpp_server
from tests.tool_calls_shared import WEATHER

pytestmark = pytest.mark.slow


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
