"""A provider in a region's place, as the edge sends to it (edge/provider.py): its credential from the
environment or a file (a rotated file re-read, an unset one a clear reason), its path prefix, its model ids,
and nothing that only Nearshore's own regions may see."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

from edge import provider as provider_module
from edge.call_body import region_body
from edge.provider import Credential, CredentialUnavailable, Provider, named, provider_body
from geo.catalog import GeoConfig, ProviderSpec, RegionSpec, check_catalog
from nearshore.protocol.headers import EDGE_SECRET, REQUEST_ID, SHARE_KEY
from nearshore.protocol.schemas import ChatCompletionRequest

BODY = json.dumps({"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}]}).encode()
SENT = {"Content-Type": "application/json", REQUEST_ID: "r1", SHARE_KEY: "s", EDGE_SECRET: "ours"}


def test_a_provider_gets_its_prefix_its_model_id_its_credential_and_none_of_ours(monkeypatch):
    monkeypatch.setenv("PARTNER_KEY", "sk-partner-123")
    spec = ProviderSpec(api_key_env="PARTNER_KEY", models={"gemma-3-270m": "google/gemma-3-270m-it"})
    out = Provider(spec, "https://api.example.com/openai/").outgoing(
        "/v1/chat/completions", SENT, BODY, "gemma-3-270m"
    )
    assert out.path == "/openai/v1/chat/completions"
    assert out.headers == {
        "Content-Type": "application/json",
        REQUEST_ID: "r1",
        "Authorization": "Bearer sk-partner-123",
    }
    sent = json.loads(out.body)
    assert sent["model"] == "google/gemma-3-270m-it" and sent["messages"] == json.loads(BODY)["messages"]


def test_a_model_it_calls_by_our_name_goes_as_it_came_and_a_named_header_carries_the_bare_key(monkeypatch):
    monkeypatch.setenv("AZ_KEY", "k-1")
    spec = ProviderSpec(api_key_env="AZ_KEY", header="api-key")
    out = Provider(spec, "http://10.0.0.5:8000").outgoing("/v1/embeddings", SENT, BODY, "gemma-3-270m")
    assert out.path == "/v1/embeddings" and json.loads(out.body) == json.loads(BODY)
    assert out.headers["api-key"] == "k-1" and "Authorization" not in out.headers


def test_no_credential_configured_sends_none():
    out = Provider(ProviderSpec(), "http://127.0.0.1:9").outgoing("/v1/completions", SENT, BODY, "m")
    assert set(out.headers) == {"Content-Type", REQUEST_ID}


def test_an_unset_variable_or_a_missing_file_is_a_reason_naming_where_never_a_value(
    monkeypatch, tmp_path: Path
):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(CredentialUnavailable, match="NOT_SET_ANYWHERE is not set"):
        Credential(ProviderSpec(api_key_env="NOT_SET_ANYWHERE")).headers()
    missing = tmp_path / "nope"
    with pytest.raises(CredentialUnavailable, match="cannot be read"):
        Credential(ProviderSpec(api_key_file=str(missing))).headers()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(CredentialUnavailable, match="is empty"):
        Credential(ProviderSpec(api_key_file=str(empty))).headers()


def test_a_rotated_file_is_read_again_and_a_file_gone_mid_rotation_keeps_the_last_value(
    monkeypatch, tmp_path: Path
):
    monkeypatch.setattr(provider_module, "_FILE_CHECK_S", 0.0)  # checked on every request here
    secret = tmp_path / "key"
    secret.write_text("first-value\n")
    credential = Credential(ProviderSpec(api_key_file=str(secret)))
    assert credential.headers() == {"Authorization": "Bearer first-value"}
    secret.write_text("second-value-longer\n")
    os.utime(secret, ns=(1, 1))  # a new stamp, however fast the rotation came
    assert credential.headers() == {"Authorization": "Bearer second-value-longer"}
    secret.unlink()
    assert credential.headers() == {"Authorization": "Bearer second-value-longer"}


def test_the_credential_never_shows_in_its_repr(monkeypatch):
    monkeypatch.setenv("PARTNER_KEY", "sk-do-not-print")
    credential = Credential(ProviderSpec(api_key_env="PARTNER_KEY"))
    credential.headers()
    assert "sk-do-not-print" not in repr(credential) and "PARTNER_KEY" in repr(credential)


def test_a_providers_body_has_what_was_said_and_no_null_or_default():
    asked = {
        "model": "gemma-3-270m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
        "stream": True,
        "metadata": {"team": "search"},  # labels a provider reads and Nearshore's regions ignore
        "store": False,
        "service_tier": "auto",
    }
    body = region_body(msgspec.convert(asked, ChatCompletionRequest), 64)
    sent = json.loads(provider_body(body, "/v1/chat/completions", "theirs/gemma"))
    assert sent == {
        **asked,
        "model": "theirs/gemma",
        "max_tokens": 64,  # what the edge reserved, said outright
        "stream_options": {"include_usage": True},
    }


def test_the_catalog_refuses_two_credential_sources_and_ids_for_models_the_edge_does_not_serve():
    regions = [
        RegionSpec(
            name="partner",
            url="https://api.example.com",
            city="london",
            provider=ProviderSpec(api_key_env="K", api_key_file="/run/k", models={"unknown-model": "x"}),
        )
    ]
    problems = check_catalog(regions, GeoConfig(), ["gemma-3-270m"])
    assert "regions[0] (partner).provider: give api_key_env or api_key_file, not both" in problems
    assert "regions[0] (partner).provider.models: unknown-model not in the edge's models" in problems


def test_a_provider_section_is_read_from_the_config_and_unknown_keys_are_refused():
    provider = {"api_key_env": "K", "probe_path": "/v1/models"}
    spec = msgspec.convert({"name": "p", "url": "https://x.example/v", "provider": provider}, RegionSpec)
    assert spec.provider is not None and spec.provider.header == "Authorization"
    with pytest.raises(msgspec.ValidationError, match="api_key"):
        inline = {"api_key": "inline"}  # a credential in the config's text is refused
        msgspec.convert({"name": "p", "url": "https://x.example", "provider": inline}, RegionSpec)


def test_a_provider_that_reports_no_usage_is_not_asked_for_it():
    asked = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body = region_body(msgspec.convert(asked, ChatCompletionRequest), 8)
    sent = json.loads(provider_body(body, "/v1/chat/completions", "theirs", reports_usage=False))
    assert "stream_options" not in sent and sent["stream"] is True


def test_a_schema_goes_as_the_provider_takes_it():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    form = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    asked = {
        "model": "gemma-3-270m",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": form,
    }
    body = region_body(msgspec.convert(asked, ChatCompletionRequest), 8)
    as_openai = json.loads(provider_body(body, "/v1/chat/completions", "theirs"))
    assert as_openai["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "c", "schema": schema},
    }
    in_object = json.loads(provider_body(body, "/v1/chat/completions", "theirs", schema_in_object=True))
    assert in_object["response_format"] == {"type": "json_object", "schema": schema}
    spec = msgspec.convert(
        {"name": "p", "url": "http://x", "provider": {"schema_as": "json_object"}}, RegionSpec
    )
    assert spec.provider is not None and spec.provider.schema_as == "json_object"


def test_an_answer_names_the_edges_model_wherever_it_names_one_and_nowhere_else():
    quoted = json.dumps({"content": 'say "model": "theirs/x" please'})  # a quote in a string is escaped
    events = (
        b'data: {"id":"c1","model": "theirs/x","choices":[{"delta":' + quoted.encode() + b"}]}\n\n"
        b'data: {"model":"theirs/x","usage":{"prompt_tokens":1}}\n\n'
    )
    renamed = named(events, "gemma-3-270m")
    first, second = (json.loads(e.removeprefix(b"data: ")) for e in renamed.split(b"\n\n") if e)
    assert first["model"] == second["model"] == "gemma-3-270m"
    assert first["choices"][0]["delta"]["content"] == 'say "model": "theirs/x" please'
