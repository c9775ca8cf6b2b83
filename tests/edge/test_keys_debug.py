"""A key's permission to see the edge's internals (the route explanation): a field of its record, a column
added to older key files in place, and ``nearshore keys create --debug`` (issue 19, item 9)."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

import pytest

from cli.keys import add_keys_arguments, run_keys
from edge.keys import KeyStore

# The table as the first release made it, before the debug column.
_OLD_SCHEMA = """
CREATE TABLE api_keys (
    key_id TEXT PRIMARY KEY, secret_sha256 TEXT NOT NULL, tenant TEXT NOT NULL, tier TEXT NOT NULL,
    rpm INTEGER NOT NULL, tpm INTEGER NOT NULL, models TEXT NOT NULL, budget_usd REAL,
    revoked INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, updated_at REAL NOT NULL
)
"""


def test_keys_are_not_debug_unless_made_so(tmp_path: Path):
    store = KeyStore(tmp_path / "keys.sqlite3")
    try:
        plain, key = store.create("acme")
        allowed, debug_key = store.create("acme", debug=True)
        assert not key.debug and debug_key.debug
        assert store.authenticate(allowed).key.debug and not store.authenticate(plain).key.debug
        assert store.get(debug_key.key_id).debug
    finally:
        store.close()
    again = KeyStore(tmp_path / "keys.sqlite3")  # and from the file, as another process reads it
    try:
        assert {k.key_id: k.debug for k in again.list()} == {key.key_id: False, debug_key.key_id: True}
    finally:
        again.close()


def test_an_older_key_file_gets_the_column_and_its_keys_stay_as_they_were(tmp_path: Path):
    path = tmp_path / "keys.sqlite3"
    db = sqlite3.connect(path)
    db.execute(_OLD_SCHEMA)
    db.execute(
        "INSERT INTO api_keys VALUES (?, ?, 'old', 'default', 60, 100000, '[]', NULL, 0, 1.0, 1.0)",
        ("0123456789ab", "0" * 64),
    )
    db.commit()
    db.close()
    store = KeyStore(path)
    try:
        [old] = store.list()
        assert old.key_id == "0123456789ab" and not old.debug
        _, new = store.create("new", debug=True)
        assert store.get(new.key_id).debug
    finally:
        store.close()
    KeyStore(path).close()  # a second open finds the column there: nothing to add


def test_keys_create_debug_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    parser = argparse.ArgumentParser()
    add_keys_arguments(parser)
    db = tmp_path / "keys.sqlite3"
    for argv in (["--debug"], []):
        assert run_keys(parser.parse_args(["create", "--tenant", "acme", *argv, "--db", str(db)])) == 0
    capsys.readouterr()
    store = KeyStore(db)
    try:
        assert sorted(k.debug for k in store.list()) == [False, True]
    finally:
        store.close()
