"""Stored responses (``/v1/responses`` with ``store``): each kept with the conversation it answered, under
its key's tenant, in a SQLite file beside the ledger.

A tenant sees only its own: every read and delete names the tenant, and an id another tenant stored is
"not found", exactly as an id that never existed (no one learns that it does). Responses older than the
configured days are dropped as new ones are stored. The calls block (SQLite): from an event loop, the
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
"""


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


class ResponseStore:
    def __init__(
        self, path: str | Path, keep_days: float = 30, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self.keep_s = keep_days * 86_400
        self.clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.executescript(_SCHEMA)

    def put(self, tenant: str, response: dict[str, Any], inputs: list[Item]) -> None:
        now = self.clock()
        row = (response["id"], tenant, now, json_encoder.encode(response), json_encoder.encode(inputs))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)", row)
                self._db.execute("DELETE FROM responses WHERE created_at < ?", (now - self.keep_s,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

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
            cursor = self._db.execute(
                "DELETE FROM responses WHERE id = ? AND tenant = ?", (response_id, tenant)
            )
        return cursor.rowcount > 0

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
