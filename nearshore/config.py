"""Config files: one TOML file per process, decoded into msgspec Structs and validated at start.

Errors name the file and the key (``configs/region.toml: engine.max_sequences: Expected `int` ...``).

A key that was renamed keeps working across an upgrade: a schema lists its old names in a class attribute
``renamed_keys`` (old dotted path -> :class:`Renamed`). An old name whose meaning is unchanged is read as the
new one, with a warning that names it; one whose meaning changed is refused with a message that names the
new key, never a bare "unknown key".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec

from nearshore.protocol.errors import split_error_path

T = TypeVar("T")
log = logging.getLogger("nearshore.config")


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and the key."""


class Renamed(NamedTuple):
    """Where an old key went (its new dotted path) and whether its value still means what it meant."""

    new: str
    # True: the old key is read as the new one (with a warning). False: refused, saying why.
    same_meaning: bool = True
    why: str = ""


def load_config(path: str | Path | None, schema: type[T], warn: bool = True) -> T:
    """Decode ``path`` into ``schema``; with no path, the schema's defaults. ``warn``: log each renamed key
    read under its old name (a process that is one of several reading the same file passes False)."""
    if path is None:
        return msgspec.convert({}, schema)
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    try:
        renamed: Mapping[str, Renamed] = getattr(schema, "renamed_keys", {})
        if renamed:
            data = msgspec.toml.decode(raw)
            if notes := _apply_renames(data, renamed, path):
                if warn:
                    for note in notes:
                        log.warning("%s: %s", path, note)
                return msgspec.convert(data, schema)
        return msgspec.toml.decode(raw, type=schema)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {_with_key(str(exc))}") from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def _apply_renames(data: dict[str, Any], renamed: Mapping[str, Renamed], path: Path) -> list[str]:
    """Move each old key in ``data`` to its new place; the warnings to log. A refused old key, or an old
    key set beside its new one, is a ConfigError."""
    notes = []
    for old, to in renamed.items():
        *parents, name = old.split(".")
        table = _table(data, parents)
        if table is None or name not in table:
            continue
        if not to.same_meaning:
            raise ConfigError(f"{path}: {old}: renamed to {to.new}, {to.why}; set {to.new} instead")
        *new_parents, new_name = to.new.split(".")
        target = _table(data, new_parents, create=True)
        if target is None:  # a value, not a table, where the new key's table goes: the schema says so
            continue
        if new_name in target:
            raise ConfigError(f"{path}: {old}: renamed to {to.new}, which is set too; remove {old}")
        target[new_name] = table.pop(name)
        notes.append(f"{old} is renamed to {to.new}: read as {to.new} (rename it in the file)")
    return notes


def _table(data: dict[str, Any], keys: list[str], create: bool = False) -> dict[str, Any] | None:
    for key in keys:
        if create and key not in data:
            data[key] = {}
        data = data.get(key)  # type: ignore[assignment]
        if not isinstance(data, dict):
            return None
    return data


def _with_key(message: str) -> str:
    """Turn msgspec's "... - at `$.engine.port`" into "engine.port: ..."."""
    text, path = split_error_path(message)
    key = path or ""
    if text.startswith("Object contains unknown field"):
        field = text.split("`")[1]
        return f"{key}.{field}: unknown key" if key else f"{field}: unknown key"
    return f"{key}: {text}" if key else text
