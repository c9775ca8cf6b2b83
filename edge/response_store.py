"""Stored responses (``/v1/responses`` with ``store``): each kept with the conversation it answered, under
its key's tenant, in a SQLite file beside the ledger.

A tenant sees only its own: every read and delete names the tenant, and an id another tenant stored is
"not found", exactly as an id that never existed (no one learns that it does). Responses older than the
configured days are dropped as new ones are stored, and so are a tenant's oldest once its stored bytes
pass its quota: the file is shared (and lies beside the ledger), so one tenant storing without end must not
fill the disk that every tenant's bill needs. The calls block (SQLite): from an event loop, the
``a``-prefixed ones run them in a thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from nearshore.protocol.responses import FunctionCallItem, Item, Message, OutputText, items_decoder
from nearshore.protocol.schemas import json_encoder

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at REAL NOT NULL,
    response BLOB NOT NULL,
    inputs BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created_at);
CREATE INDEX IF NOT EXISTS responses_tenant ON responses (tenant, created_at);
"""
# Each tenant's stored bytes, kept with every write: a quota check must not sum a tenant's rows.
_TENANT_BYTES = "CREATE TABLE tenant_bytes (tenant TEXT PRIMARY KEY, bytes INTEGER NOT NULL)"
_SIZE = "length(response) + length(inputs)"  # a blob's length is in its record header: no blob is read
_EVICT_BATCH = 64


@dataclass(frozen=True, slots=True)
class Stored:
    response: dict[str, Any]  # the response object as the client got it
    inputs: list[Item]  # the conversation it answered: its earlier turns' items, then its own input
    size: int = 0  # bytes stored for both (their JSON): what continuing it carries

    def conversation(self) -> list[Item]:
        """What a response that continues this one (``previous_response_id``) comes after: this one's
        inputs, then its output."""
        return [*self.inputs, *output_items(self.response)]


def output_items(response: dict[str, Any]) -> list[Item]:
    """A response's output as input items: its messages and its function calls."""
    items: list[Item] = []
    for item in response.get("output") or ():
        if item.get("type") == "message":
            texts = [
                OutputText(p.get("text", ""))
                for p in item.get("content") or ()
                if p.get("type") == "output_text"
            ]
            items.append(Message(role="assistant", content=list(texts), id=item.get("id")))
        elif item.get("type") == "function_call":
            items.append(
                FunctionCallItem(
                    call_id=item["call_id"], name=item["name"], arguments=item["arguments"], id=item.get("id")
                )
            )
    return items


class OverQuota(Exception):
    """One response larger than its tenant's whole quota: it is not stored."""


class ResponseStore:
    def __init__(
        self,
        path: str | Path,
        keep_days: float = 30,
        clock: Callable[[], float] = time.time,
        max_tenant_bytes: int = 256 << 20,
    ) -> None:
        self.path = Path(path)
        self.keep_s = keep_days * 86_400
        self.clock = clock
        self.max_tenant_bytes = max_tenant_bytes
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.executescript(_SCHEMA)
        self._count_tenants_once()

    def _count_tenants_once(self) -> None:
        """A store written before the quota has no tally: count each tenant's bytes once, now."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'tenant_bytes'").fetchone():
                db.execute(_TENANT_BYTES)
                db.execute(
                    f"INSERT INTO tenant_bytes SELECT tenant, SUM({_SIZE}) FROM responses GROUP BY tenant"
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def tenant_bytes(self, tenant: str) -> int:
        """What ``tenant`` has stored, in bytes (its responses' and conversations' JSON)."""
        with self._lock:
            row = self._db.execute("SELECT bytes FROM tenant_bytes WHERE tenant = ?", (tenant,)).fetchone()
        return row[0] if row else 0

    def put(self, tenant: str, response: dict[str, Any], inputs: list[Item]) -> None:
        """Store ``response``; the tenant's oldest go first if it would pass its quota. Raises
        :class:`OverQuota` for a response larger than the whole quota (nothing is dropped for it)."""
        now = self.clock()
        row = (response["id"], tenant, now, json_encoder.encode(response), json_encoder.encode(inputs))
        size = len(row[3]) + len(row[4])
        if size > self.max_tenant_bytes:
            raise OverQuota(f"{size} bytes, more than the tenant's quota of {self.max_tenant_bytes}")
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                self._drop(db, "id = ?", (row[0],))  # (a replaced row's bytes leave its tally)
                self._drop(db, "created_at < ?", (now - self.keep_s,))
                self._make_room(db, tenant, size)
                db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?)", row)
                db.execute(
                    "INSERT INTO tenant_bytes VALUES (?, ?) "
                    "ON CONFLICT (tenant) DO UPDATE SET bytes = bytes + excluded.bytes",
                    (tenant, size),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def _make_room(self, db: sqlite3.Connection, tenant: str, size: int) -> None:
        """Drop the tenant's oldest responses until ``size`` more bytes fit its quota."""
        found = db.execute("SELECT bytes FROM tenant_bytes WHERE tenant = ?", (tenant,)).fetchone()
        over = (found[0] if found else 0) + size - self.max_tenant_bytes
        while over > 0:
            oldest = db.execute(
                f"SELECT id, {_SIZE} FROM responses WHERE tenant = ? ORDER BY created_at LIMIT ?",
                (tenant, _EVICT_BATCH),
            ).fetchall()
            if not oldest:
                return
            for response_id, stored in oldest:
                self._drop(db, "id = ?", (response_id,))
                over -= stored
                if over <= 0:
                    return

    @staticmethod
    def _drop(db: sqlite3.Connection, where: str, args: tuple) -> None:
        """Delete the responses ``where`` says, their bytes taken off their tenants' tallies."""
        gone = db.execute(
            f"SELECT tenant, SUM({_SIZE}) FROM responses WHERE {where} GROUP BY tenant", args
        ).fetchall()
        if not gone:
            return
        db.execute(f"DELETE FROM responses WHERE {where}", args)
        db.executemany(
            "UPDATE tenant_bytes SET bytes = bytes - ? WHERE tenant = ?", [(b, t) for t, b in gone]
        )

    def get(self, tenant: str, response_id: str) -> Stored | None:
        with self._lock:
            row = self._db.execute(
                "SELECT response, inputs FROM responses WHERE id = ? AND tenant = ? AND created_at >= ?",
                (response_id, tenant, self.clock() - self.keep_s),
            ).fetchone()
        if row is None:
            return None
        return Stored(msgspec.json.decode(row[0]), items_decoder.decode(row[1]), len(row[0]) + len(row[1]))

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                found = db.execute(
                    "SELECT 1 FROM responses WHERE id = ? AND tenant = ?", (response_id, tenant)
                ).fetchone()
                if found:
                    self._drop(db, "id = ? AND tenant = ?", (response_id, tenant))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return found is not None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- from an event loop ---

    async def aput(self, tenant: str, response: dict[str, Any], inputs: list[Item]) -> None:
        await asyncio.to_thread(self.put, tenant, response, inputs)

    async def aget(self, tenant: str, response_id: str) -> Stored | None:
        return await asyncio.to_thread(self.get, tenant, response_id)

    async def adelete(self, tenant: str, response_id: str) -> bool:
        return await asyncio.to_thread(self.delete, tenant, response_id)
