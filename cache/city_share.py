"""One response cache for a city's edges, through the city's Redis (``[cache] share_redis_url``).

Each edge keeps its own store (cache/store.py: entries, partitions, the semantic index) and serves only
from it: a lookup never waits on Redis. What an edge stores, replaces or evicts it also appends to one
Redis stream; every edge follows the stream and applies the others' changes to its own store, vector
included, so an answer stored through one edge is an exact hit on the others within the follow's delay
(milliseconds) and a semantic hit as soon as its row is appended there. The stream is the store the
replicas are rebuilt from: a new edge (or one whose folder was lost) reads it from its start, an edge that
restarts from where it stopped (the id is kept in its cache folder). Entries carry their partition (the
tenant's scope, model and settings), so a tenant's entries are served to no one else on any edge; the
verifier and the live audit run on each edge's own lookups as before.

A vector is used only by an edge whose embedder made it (the same model: ``vector_kind``). An entry without a
usable vector (another model there, or none made) is embedded again by the edge that receives it, in the
background, and only where the request that stored it could be embedded: the change carries that request's
data-residency scope (the regions a region-embedding edge may send its question to). An answer stored while
its edge's embedder was busy travels at once for exact hits, and its vector follows when it is made.

The live audit's decided verdicts travel too (``cache.audit.Verdict``): every edge's book records the
others', so a partition found wrong through one edge stops serving semantic hits on all of them, and an
entry's raised threshold holds on all (its eviction travels as any other).

Redis out of reach: lookups and stores go on locally; what was stored meanwhile waits in a bounded outbox
and is appended when Redis answers again, and the follower resumes from its id (an entry trimmed from the
stream meanwhile is only a miss on the other edges). The stream keeps the last ``share_stream_max``
changes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from redis.asyncio import Redis
from redis.exceptions import RedisError

from cache import admin
from cache.audit import Verdict
from cache.store import CacheStore, Entry
from cache.store_vectors import ID_BYTES

log = logging.getLogger("nearshore.cache")

STREAM = "nearshore:cache:city"
_OUTBOX_MAX = 10_000  # stored while Redis is away; past it the oldest are only local
_READ_COUNT = 256
_BLOCK_MS = 1000
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
_decoder = msgspec.msgpack.Decoder(Entry)
_encoder = msgspec.msgpack.Encoder()
_verdict_decoder = msgspec.msgpack.Decoder(Verdict)
_regions_decoder = msgspec.json.Decoder(list[str] | None)

# An entry another edge stored, to embed here: its exact key, the entry, the regions it may be embedded in.
Reindex = Callable[[str, Entry, frozenset[str] | None], None]
Learn = Callable[[Verdict], None]  # another edge's audit verdict, for this edge's book


def vector_kind(model_dir: Path | None, region_model: str = "") -> str:
    """What made a vector, so that an edge uses only vectors of its own model: a region's model by name,
    a local model by its folder's config and files (names and sizes: the same weights wherever installed)."""
    if region_model:
        return f"region:{region_model}"
    if model_dir is None:
        return ""
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(model_dir)}:{path.stat().st_size};".encode())
    with contextlib.suppress(OSError):
        digest.update((model_dir / "config.json").read_bytes())
    return f"local:{digest.hexdigest()}"


class CityShare:
    """Publishes this edge's cache changes to the city's stream and applies the others' to ``store``."""

    def __init__(
        self,
        url: str,
        store: CacheStore,
        dim: int,
        folder: Path,
        stream_max: int = 200_000,
        kind: str = "",
        reindex: Reindex | None = None,
        learn: Learn | None = None,
    ) -> None:
        self.url = url
        self.store = store
        self.dim = dim
        self.kind = kind  # vector_kind of this edge's embedder
        self._reindex = reindex  # embeds an entry here that came without a vector this edge can use
        self._learn = learn
        self.stream_max = stream_max
        self.origin = os.urandom(8).hex()  # this process: its own changes are not applied twice
        self._position = folder / "city-stream-position"
        self.last_id = self._read_position()
        self._outbox: collections.deque[dict[str, Any]] = collections.deque(maxlen=_OUTBOX_MAX)
        self._wake = asyncio.Event()
        self._redis: Redis | None = None
        self.reachable = True
        self.published = 0
        self.applied = 0
        self.dropped = 0  # changes that never left this edge (the outbox was full)

    # --- what this edge changed (called on the loop, never waits) ---------------------------------------

    def stored(
        self,
        exact: str,
        entry: Entry,
        vector: np.ndarray | None,
        replace: bool,
        regions: frozenset[str] | None = None,
        follows: bool = False,
    ) -> None:
        """``regions``: the storing request's residency scope (where its question may be embedded);
        ``follows``: its vector is being made and comes later (``indexed``)."""
        change = self._entry_change("put", exact, entry, vector)
        change["regions"] = msgspec.json.encode(None if regions is None else sorted(regions))
        self._send({**change, "replace": "1" if replace else "0", "follows": "1" if follows else "0"})

    def indexed(self, exact: str, entry: Entry, vector: np.ndarray) -> None:
        """The vector of an entry stored earlier without one (its edge's embedder was busy then)."""
        self._send(self._entry_change("vec", exact, entry, vector))

    def verdict(self, verdict: Verdict) -> None:
        """A decided verdict of this edge's live audit, for the others' books."""
        self._send({"op": "verdict", "verdict": _encoder.encode(verdict)})

    def _entry_change(self, op: str, exact: str, entry: Entry, vector: np.ndarray | None) -> dict[str, Any]:
        vector_bytes = b"" if vector is None else np.asarray(vector, dtype=np.float32).tobytes()
        entry_bytes = _encoder.encode(entry)
        return {"op": op, "exact": exact, "entry": entry_bytes, "vector": vector_bytes, "kind": self.kind}

    def evicted(self, exact: str) -> None:
        self._send({"op": "del", "exact": exact})

    def _send(self, fields: dict[str, Any]) -> None:
        if len(self._outbox) == self._outbox.maxlen:
            self.dropped += 1
        self._outbox.append({**fields, "origin": self.origin})
        self._wake.set()

    # --- the tasks --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Publish and follow until cancelled."""
        self._redis = Redis.from_url(self.url, socket_timeout=5.0, socket_connect_timeout=5.0)
        try:
            await asyncio.gather(self._publish(), self._follow())
        finally:
            with contextlib.suppress(RedisError, OSError):
                await self._redis.aclose()

    async def _publish(self) -> None:
        failures = 0
        while True:
            if not self._outbox:
                self._wake.clear()
                await self._wake.wait()
            batch = [self._outbox.popleft() for _ in range(min(len(self._outbox), _READ_COUNT))]
            try:
                async with self._client().pipeline(transaction=False) as pipe:
                    for fields in batch:
                        pipe.xadd(STREAM, fields, maxlen=self.stream_max, approximate=True)
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                # Back to the front, in order; a full outbox drops its newest (counted).
                room = _OUTBOX_MAX - len(self._outbox)
                self.dropped += max(0, len(batch) - room)
                self._outbox.extendleft(reversed(batch))
                self._lost(exc)
                await asyncio.sleep(_BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)])
                failures += 1
                continue
            self.published += len(batch)
            failures = 0

    async def _follow(self) -> None:
        failures = 0
        while True:
            try:
                answer = await self._client().xread(
                    {STREAM: self.last_id}, count=_READ_COUNT, block=_BLOCK_MS
                )
            except (RedisError, OSError) as exc:
                self._lost(exc)
                await asyncio.sleep(_BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)])
                failures += 1
                continue
            if not self.reachable:
                log.warning("cache: the city's Redis is back; following from %s", self.last_id)
            self.reachable, failures = True, 0
            for _stream, messages in answer or []:
                if messages:
                    for on_loop in await asyncio.to_thread(self._apply, messages):
                        on_loop()

    def _client(self) -> Redis:
        assert self._redis is not None
        return self._redis

    def _lost(self, exc: BaseException) -> None:
        if self.reachable:
            log.warning("cache: the city's Redis is out of reach (%s): serving and storing locally", exc)
        self.reachable = False

    # --- applying the others' changes (a worker thread) ---------------------------------------------------

    def _apply(self, messages: list[tuple[bytes, dict[bytes, bytes]]]) -> list[Callable[[], None]]:
        """Apply the changes to the store; returns what is left to do on the event loop (an entry to embed
        here, a verdict for the audit's book), in order."""
        now, on_loop = time.time(), []
        for message_id, fields in messages:
            try:
                if (then := self._apply_one(fields, now)) is not None:
                    on_loop.append(then)
            except Exception as exc:  # a malformed message or a full disk: skipped, never the follower
                log.warning("cache: a change from the city's stream was not applied: %s", exc)
            self.last_id = message_id.decode()
        self._write_position()
        return on_loop

    def _apply_one(self, fields: dict[bytes, bytes], now: float) -> Callable[[], None] | None:
        if fields.get(b"origin", b"").decode() == self.origin:
            return None
        if fields[b"op"] == b"verdict":
            verdict = _verdict_decoder.decode(fields[b"verdict"])
            self.applied += 1
            return None if self._learn is None else functools.partial(self._learn, verdict)
        if fields[b"op"] == b"clear":  # `nearshore cache clear` on one edge: the same on every edge
            partition = fields.get(b"partition", b"").decode() or None
            older = fields.get(b"older_than_s", b"").decode()
            at = float(fields[b"at"])
            admin.clear(self.store.folder, partition, float(older) if older else None, now=at)
            self.applied += 1
            return None
        exact = fields[b"exact"].decode()
        if len(bytes.fromhex(exact)) != ID_BYTES:  # an exact key is a 16-byte digest, as its index rows hold
            raise ValueError(f"not an exact key: {exact[:40]!r}")
        op, then = fields[b"op"], None
        if op == b"del":
            self.store.delete(exact)
        elif op in (b"put", b"vec"):
            entry = _decoder.decode(fields[b"entry"])
            if entry.expires_s <= now:
                return None
            vector = self._vector(fields)
            if op == b"vec":
                if vector is not None:  # else this edge embedded the entry itself when it came
                    self.store.add_vector(exact, entry, vector)
            elif self.store.put(exact, entry, vector, replace=fields.get(b"replace") == b"1"):
                # Without a vector this edge can use: embedded here, within the request's residency scope,
                # unless the sender's own (of this edge's kind) is on its way.
                coming = fields.get(b"follows") == b"1" and self._same_kind(fields)
                if vector is None and not coming and self._reindex is not None:
                    regions = _regions_decoder.decode(fields.get(b"regions") or b"null")
                    scope = None if regions is None else frozenset(regions)
                    then = functools.partial(self._reindex, exact, entry, scope)
        else:
            raise ValueError(f"unknown change {op[:20]!r}")
        self.applied += 1
        return then

    def _same_kind(self, fields: dict[bytes, bytes]) -> bool:
        kind = fields.get(b"kind")  # absent: an edge of an earlier release (MiniLM, as this one was then)
        return kind is None or kind.decode() == self.kind

    def _vector(self, fields: dict[bytes, bytes]) -> np.ndarray | None:
        """The sender's vector when this edge's embedder would have made it (same model, same size, finite),
        else None."""
        raw = fields.get(b"vector", b"")
        if not raw or self.dim <= 1 or len(raw) != self.dim * 4 or not self._same_kind(fields):
            return None
        vector = np.frombuffer(raw, dtype=np.float32)
        return vector if np.isfinite(vector).all() else None

    def _read_position(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            text = self._position.read_text().strip()
            if text and all(part.isdigit() for part in text.split("-", 1)):
                return text
        return "0"  # a new (or lost) replica: the whole stream

    def _write_position(self) -> None:
        with contextlib.suppress(OSError):
            temporary = self._position.with_name(self._position.name + ".tmp")
            temporary.write_text(self.last_id)
            os.replace(temporary, self._position)

    def health(self) -> dict[str, object]:
        return {
            "state": "up" if self.reachable else "out of reach (serving and storing locally)",
            "waiting": len(self._outbox),
            "published": self.published,
            "applied": self.applied,
            "dropped": self.dropped,
        }


def announce_clear(url: str, partition: str | None, older_than_s: float | None) -> None:
    """Tell every edge of the city to clear what ``nearshore cache clear`` cleared here (applied in order
    with the stores around it: what was stored before the clear is cleared, what comes after stays)."""
    import redis  # the operator's CLI, synchronous

    client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
    fields = {"op": "clear", "partition": partition or "", "at": repr(time.time()), "origin": "cli"}
    fields["older_than_s"] = "" if older_than_s is None else repr(older_than_s)
    try:
        client.xadd(STREAM, fields)
    except RedisError as exc:  # one line from the CLI, as its other failures are
        raise ConnectionError(
            f"cache.share_redis_url: the city's Redis did not take the clear: {exc}"
        ) from None
    finally:
        client.close()
