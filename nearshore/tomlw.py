"""TOML text from a dict, for the configs code writes (the launcher, the benchmarks, the tests' fixtures).

The reading side is the standard library's ``tomllib``; this is its small mirror for what configs hold:
strings (escaped), paths (as strings), booleans, integers, floats, lists, tables (``dict`` values) and
arrays of tables (a non-empty list of dicts). A value of any other type is a ``TypeError``, not a guess.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import PurePath

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
# Every character a basic string may not hold as itself: quote, backslash, and control characters.
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')


def dumps(document: Mapping[str, object]) -> str:
    """The document as TOML: its plain keys first, then each table, then each array of tables."""
    lines: list[str] = []
    _table(lines, (), document, header=None)
    return "\n".join(lines) + "\n"


def _table(lines: list[str], path: tuple[str, ...], table: Mapping[str, object], header: str | None) -> None:
    plain = [(k, v) for k, v in table.items() if not _is_table(v) and not _is_table_array(v)]
    nested = [(k, v) for k, v in table.items() if _is_table(v) or _is_table_array(v)]
    # A table holding only tables needs no header of its own: its children's headers imply it.
    if header is not None and (plain or not nested or header.startswith("[[")):
        lines.append(header)
    lines += [f"{_key(k)} = {_value(v)}" for k, v in plain]
    for key, value in nested:
        inner = (*path, key)
        name = ".".join(map(_key, inner))
        if _is_table(value):
            _table(lines, inner, value, f"[{name}]")  # type: ignore[arg-type]
        else:
            for item in value:  # type: ignore[union-attr]
                _table(lines, inner, item, f"[[{name}]]")


def _is_table(value: object) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: object) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _key(key: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"a TOML key must be a string, not {key!r}")
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    escaped = _NEEDS_ESCAPE.sub(lambda m: _ESCAPES.get(m[0], f"\\u{ord(m[0]):04x}"), text)
    return f'"{escaped}"'


def _value(value: object) -> str:
    if isinstance(value, bool):  # before int: a bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, PurePath):
        return _string(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):  # a table inside an array: inline
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}: {value!r}")
