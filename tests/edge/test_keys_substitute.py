"""A key's own permission to a substitute in a cable cut (issue 22): a field of its record, a column added to
older key files in place, ``nearshore keys create --substitute``, and the degraded policy honouring it."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

from cli.keys import add_keys_arguments, run_keys
from edge.config import DegradedConfig
from edge.degraded_policy import DegradedTier
from edge.keys import KeyStore
from geo.catalog import RegionSpec

SMALL, LARGE = "smollm2-135m", "gemma-3-270m"
# The key table before the substitute column (it had debug already).
_BEFORE = """
CREATE TABLE api_keys (
    key_id TEXT PRIMARY KEY, secret_sha256 TEXT NOT NULL, tenant TEXT NOT NULL, tier TEXT NOT NULL,
    rpm INTEGER NOT NULL, tpm INTEGER NOT NULL, models TEXT NOT NULL, budget_usd REAL,
    revoked INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    debug INTEGER NOT NULL DEFAULT 0
)
"""


def test_a_key_may_substitute_only_when_made_so_and_the_file_says_it(tmp_path: Path):
    store = KeyStore(tmp_path / "keys.sqlite3")
    try:
        plain, key = store.create("acme")
        allowed, substitutes = store.create("acme", substitute=True)
        assert not key.substitute and substitutes.substitute
        assert store.authenticate(allowed).key.substitute and not store.authenticate(plain).key.substitute
    finally:
        store.close()
    again = KeyStore(tmp_path / "keys.sqlite3")
    try:
        assert {k.key_id: k.substitute for k in again.list()} == {key.key_id: False, substitutes.key_id: True}
    finally:
        again.close()


def test_an_older_key_file_gets_the_column_and_its_keys_do_not_substitute(tmp_path: Path):
    path = tmp_path / "keys.sqlite3"
    db = sqlite3.connect(path)
    db.execute(_BEFORE)
    db.execute(
        "INSERT INTO api_keys VALUES (?, ?, 'old', 'default', 60, 100000, '[]', NULL, 0, 1.0, 1.0, 1)",
        ("0123456789ab", "0" * 64),
    )
    db.commit()
    db.close()
    store = KeyStore(path)
    try:
        [old] = store.list()
        assert old.debug and not old.substitute
        _, new = store.create("new", substitute=True)
        assert store.get(new.key_id).substitute
    finally:
        store.close()


def test_keys_create_substitute_from_the_command_line(tmp_path: Path, capsys):
    parser = argparse.ArgumentParser()
    add_keys_arguments(parser)
    db = tmp_path / "keys.sqlite3"
    args = parser.parse_args(["create", "--tenant", "acme", "--substitute", "--db", str(db)])
    assert run_keys(args) == 0
    store = KeyStore(db)
    try:
        [key] = store.list()
        assert key.substitute
    finally:
        store.close()


def test_the_key_s_permission_gives_the_stand_in_where_the_policy_would_refuse():
    regions = [
        RegionSpec(name="london", url="http://l", models=[LARGE]),
        RegionSpec(name="lagos", url="http://g", models=[SMALL], pool="small", local=True),
    ]
    never = DegradedTier(DegradedConfig(substitute="never"), regions, [SMALL, LARGE])
    assert never.policy("default", LARGE).stand_in == ""
    assert never.policy("default", LARGE, key_substitutes=True).stand_in == SMALL
    # A model the local region serves itself needs no stand-in, whoever asks.
    assert never.policy("default", SMALL, key_substitutes=True).stand_in == ""
