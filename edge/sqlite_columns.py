"""Columns a table gained since its first schema, added to a file an older release wrote (the ledger, the
key store): at open, by whichever process opens it first."""

from __future__ import annotations

import sqlite3


def add_missing_columns(db: sqlite3.Connection, table: str, columns: dict[str, str]) -> None:
    """Add each of ``columns`` (name -> declaration) that ``table`` lacks."""
    have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    for name, declaration in columns.items():
        if name not in have:
            try:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
            except sqlite3.OperationalError as exc:  # another process added it a moment ago
                if "duplicate column" not in str(exc):
                    raise
