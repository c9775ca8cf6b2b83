"""The one TOML writer for configs made by code: what it writes, tomllib reads back unchanged."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from edge.config import EdgeConfig
from nearshore.config import load_config
from nearshore.tomlw import dumps


def test_round_trip_of_every_kind_of_value():
    document = {
        "name": "edge",
        "port": 8443,
        "ratio": 0.25,
        "big": 1e20,
        "on": True,
        "off": False,
        "tags": ["a", "b"],
        "empty": [],
        "server": {"host": "127.0.0.1", "ports": [1, 2], "nested": {"deep": 1}},
        "metrics": {},
        "regions": [{"name": "london", "url": "https://l"}, {"name": "virginia", "weights": {"w": 2}}],
        "only": {"tables": {"x": 1}},
    }
    assert tomllib.loads(dumps(document)) == document


@pytest.mark.parametrize(
    "text",
    [
        'say "hi"',
        "C:\\Users\\x\\keys.sqlite3",
        "two\nlines\tand\r\ncontrol \x00\x01\x1f\x7f",
        "ünïcödé ✓ 🌍",
        "[section]\nkey = 'injected'",
        "",
    ],
)
def test_strings_are_escaped(text: str):
    """A string never ends early or injects keys: quotes, backslashes and control characters escaped."""
    written = dumps({"value": text, "list": [text], "inline": [{"in": text}], text or "k": 1})
    assert tomllib.loads(written) == {"value": text, "list": [text], "inline": [{"in": text}], text or "k": 1}


def test_paths_are_strings_and_odd_keys_are_quoted(tmp_path: Path):
    written = dumps({"keys_db": tmp_path / "k e y s.db", "a.b": 1, "with space": {"x": 1}})
    assert tomllib.loads(written) == {
        "keys_db": str(tmp_path / "k e y s.db"),
        "a.b": 1,
        "with space": {"x": 1},
    }


def test_a_value_with_no_toml_form_is_refused():
    with pytest.raises(TypeError, match="no TOML form for object"):
        dumps({"x": object()})
    with pytest.raises(TypeError, match="key must be a string"):
        dumps({1: 2})  # type: ignore[dict-item]


def test_a_written_edge_config_loads(tmp_path: Path):
    """The shape the launcher, the benchmarks and the fixtures write, read by the edge's own loader."""
    path = tmp_path / "edge.toml"
    path.write_text(
        dumps(
            {
                "name": 'lagos "edge"',
                "keys_db": tmp_path / "keys.sqlite3",
                "server": {"port": 0},
                "tls": {"enabled": False},
                "regions": [{"name": "london", "url": "http://127.0.0.1:1"}],
            }
        )
    )
    config = load_config(path, EdgeConfig)
    assert config.name == 'lagos "edge"' and config.keys_db == str(tmp_path / "keys.sqlite3")
    assert [r.name for r in config.regions] == ["london"] and not config.tls.enabled
