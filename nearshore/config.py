"""Config files: one TOML file per process, decoded into msgspec Structs and validated at start.

Errors name the file and the key (``configs/region.toml: engine.max_sequences: Expected `int` ...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import msgspec

from nearshore.protocol.errors import split_error_path

T = TypeVar("T")


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and the key."""


def load_config(path: str | Path | None, schema: type[T]) -> T:
    """Decode ``path`` into ``schema``; with no path, the schema's defaults."""
    if path is None:
        return msgspec.convert({}, schema)
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    try:
        return msgspec.toml.decode(raw, type=schema)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {_with_key(str(exc))}") from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def _with_key(message: str) -> str:
    """Turn msgspec's "... - at `$.engine.port`" into "engine.port: ..."."""
    text, path = split_error_path(message)
    key = path or ""
    if text.startswith("Object contains unknown field"):
        field = text.split("`")[1]
        return f"{key}.{field}: unknown key" if key else f"{field}: unknown key"
    return f"{key}: {text}" if key else text
