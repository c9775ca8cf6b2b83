"""An OpenAI-compatible provider in a region's place: what the edge sends there instead of what it sends its
own regional nodes.

A provider gets the request under its URL's path prefix, with its credential (a bearer token or a named
header, read from an environment variable or a file, :class:`Credential`) and its own id for the model;
it never gets what only Nearshore's regions may see (the edge's shared secret, the key's share id). Its
health is a cheap GET it does have (``/v1/models``), with the credential. The credential's value is only
ever put in a request's headers: never in a log line, an error, ``/health`` or a repr.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from geo.catalog import ProviderSpec
from nearshore.protocol.headers import EDGE_SECRET, SHARE_KEY
from nearshore.protocol.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

# Only Nearshore's own regions may see these: the edge's secret, the key's share id (a fair-queue handle).
_OURS_ONLY = frozenset({EDGE_SECRET, SHARE_KEY})
# A rotated credential file is seen within this long (its size and mtime are checked, not its text).
_FILE_CHECK_S = 1.0


class CredentialUnavailable(Exception):
    """The credential's variable is unset or its file unreadable (the message names which, never a value)."""


class Credential:
    """A provider's credential, from an environment variable or a file (re-read when it changes)."""

    def __init__(self, spec: ProviderSpec) -> None:
        self.header = spec.header
        self._env = spec.api_key_env
        self._file = Path(spec.api_key_file) if spec.api_key_file else None
        self._value = ""
        self._stamp: tuple[int, int] | None = None  # the file's (mtime_ns, size) when read
        self._checked_at = -float("inf")

    def __repr__(self) -> str:
        source = f"env {self._env}" if self._env else f"file {self._file}" if self._file else "none"
        return f"Credential({self.header}, from {source})"

    @property
    def source(self) -> str:
        """Where the credential comes from, for messages (never its value)."""
        return f"${self._env}" if self._env else str(self._file) if self._file else ""

    def headers(self) -> dict[str, str]:
        """The header that carries it ({} for a provider that takes requests without one)."""
        value = self.value()
        if not value:
            return {}
        if self.header.lower() == "authorization":
            return {"Authorization": f"Bearer {value}"}
        return {self.header: value}

    def value(self) -> str:
        if self._env:
            value = os.environ.get(self._env, "").strip()
            if not value:
                raise CredentialUnavailable(f"the environment variable {self._env} is not set")
            return value
        if self._file is None:
            return ""
        now = time.monotonic()
        if now - self._checked_at >= _FILE_CHECK_S or not self._value:
            self._checked_at = now
            self._reread()
        return self._value

    def _reread(self) -> None:
        assert self._file is not None
        try:
            stat = self._file.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp != self._stamp or not self._value:
                value = self._file.read_text().strip()
                if not value:
                    raise CredentialUnavailable(f"the credential file {self._file} is empty")
                self._value, self._stamp = value, stamp
        except OSError as exc:
            if not self._value:  # a file replaced mid-rotation: the last good value serves until it is back
                raise CredentialUnavailable(
                    f"the credential file {self._file} cannot be read ({type(exc).__name__})"
                ) from None


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One request as it leaves for an upstream."""

    path: str
    headers: dict[str, str]
    body: bytes


class Provider:
    """What the edge sends an OpenAI-compatible provider: its path prefix, credential and model ids."""

    def __init__(self, spec: ProviderSpec, url: str) -> None:
        self.prefix = urlsplit(url).path.rstrip("/")
        self.credential = Credential(spec)
        self.models = dict(spec.models)
        self.probe_path = self.prefix + spec.probe_path
        self.reports_usage = spec.reports_usage
        self.continues_answers = spec.continues_answers
        self.schema_as = spec.schema_as

    def outgoing(self, path: str, headers: dict[str, str], body: bytes, model: str) -> Outgoing:
        """The request for ``model`` as the provider takes it (CredentialUnavailable: none can go)."""
        sent = {name: value for name, value in headers.items() if name not in _OURS_ONLY}
        sent.update(self.credential.headers())
        if body:
            body = provider_body(
                body, path, self.models.get(model, model), self.reports_usage, self.schema_as == "json_object"
            )
        return Outgoing(self.prefix + path, sent, body)

    def probe_headers(self) -> dict[str, str]:
        return self.credential.headers()


_MODEL_FIELD = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')


def named(data: bytes, model: str) -> bytes:
    """``data`` (a JSON answer, or SSE events of JSON chunks) naming ``model`` wherever it names its model:
    the client asked for the edge's name, and is not told which provider's id served it. (Inside a JSON
    string a quote is escaped, so only a real ``"model"`` field matches.)"""
    field = b'"model":' + msgspec.json.encode(model)
    return _MODEL_FIELD.sub(lambda _: field, data)


def _defaults(schema: type[msgspec.Struct]) -> dict[str, object]:
    return {f.name: f.default for f in msgspec.structs.fields(schema) if f.default is not msgspec.NODEFAULT}


# A field at its default is left out: a provider may not know it (an OpenAI API refuses a parameter it does
# not know), or may refuse a null where it wants a number.
_DEFAULTS = {
    "/v1/chat/completions": _defaults(ChatCompletionRequest),
    "/v1/completions": _defaults(CompletionRequest),
    "/v1/embeddings": _defaults(EmbeddingRequest),
}


def provider_body(
    body: bytes, path: str, model: str, reports_usage: bool = True, schema_in_object: bool = False
) -> bytes:
    """The JSON request ``body`` as a provider takes it: asking for ``model``, with only what was said (no
    field at its default, no null anywhere; no usage chunk asked of one that sends none; a json_schema
    response format as a json_object with its schema, to one that takes it so)."""
    request = msgspec.json.decode(body)
    defaults = _DEFAULTS.get(path, {})
    sent = {
        name: _without_nulls(value)
        for name, value in request.items()
        if value is not None and not (name in defaults and defaults[name] == value)
    }
    sent["model"] = model
    if not reports_usage:
        sent.pop("stream_options", None)
    form = sent.get("response_format")
    if schema_in_object and isinstance(form, dict) and form.get("type") == "json_schema":
        sent["response_format"] = {
            "type": "json_object",
            "schema": form.get("json_schema", {}).get("schema", {}),
        }
    return msgspec.json.encode(sent)


def _without_nulls(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
