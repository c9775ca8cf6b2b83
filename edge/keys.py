"""API keys: issued once in plaintext, stored hashed in SQLite, checked on every request from memory.

A key reads ``ns-<key_id>-<secret>``: ``key_id`` is 12 lowercase hex characters, public (it appears in
logs, the ledger and reports); ``secret`` is 32 random bytes, base64url without padding. Only
``sha256(secret)`` is stored. A fast hash is right here, unlike for passwords: the secret carries 256 bits
of entropy, so there is nothing to guess from a leaked hash, and a slow hash would only cost every request.

The edge authenticates every request from an in-memory copy of the table and never queries SQLite on the
request path: an unknown key id is answered as fast as a known one, so timing does not tell which ids
exist. Keys created or revoked by another process (``nearshore keys``) reach the copy through
:func:`edge.key_watch.refresh_keys`, a task that checks ``PRAGMA data_version`` off the request path when the
kernel says the file was written (a slow poll behind it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Literal

import msgspec

from edge.sqlite_columns import add_missing_columns

KEY_PREFIX = "ns-"
_KEY_ID_HEX = 12
_SECRET_BYTES = 32
# token_urlsafe(32) is always 43 characters of the base64url alphabet.
_KEY = re.compile(r"ns-([0-9a-f]{12})-([A-Za-z0-9_-]{43})")
_KEY_LENGTH = len(KEY_PREFIX) + _KEY_ID_HEX + 1 + 43

log = logging.getLogger("nearshore.keys")

# "unavailable": the key store has been out of reach for longer than the edge may trust its copy (a
# PostgreSQL store; edge/keys_pg.py), or the key is one the copy does not know while it is out of reach.
AuthReason = Literal["ok", "missing", "malformed", "unknown", "revoked", "unavailable"]


class KeySettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a key is issued with (``nearshore keys create``, the admin API's POST body)."""

    tenant: str
    tier: str = "default"
    rpm: int = 60
    tpm: int = 100_000
    # Empty: every model is allowed.
    models: list[str] = msgspec.field(default_factory=list)
    budget_usd: float | None = None
    # May ask for the edge's internals on its own responses (`x-nearshore-debug: route`: regions, RTTs,
    # policy names); other keys' asks are ignored.
    debug: bool = False
    # In a cable cut, may the local stand-in model answer for a model only the remote regions serve (the
    # edge's [degraded] policy decides for the other keys)?
    substitute: bool = False


class ApiKey(KeySettings, frozen=True, kw_only=True):
    """One key's public record: everything but its secret."""

    key_id: str
    revoked: bool = False
    created_at: float = 0.0

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


class AuthResult(msgspec.Struct, frozen=True):
    """``key`` is set for "ok" and "revoked" (so the caller can log whose key it was), else None.

    A wrong secret for a known key_id reads "unknown", like a key_id that does not exist.
    """

    key: ApiKey | None
    reason: AuthReason

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


class KeyChange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What ``keys update`` (or the admin API's PATCH) may change; a field left unset stays as it is. A
    key's tenant and secret never change: a new tenant or secret is a new key."""

    tier: str | msgspec.UnsetType = msgspec.UNSET
    rpm: int | msgspec.UnsetType = msgspec.UNSET
    tpm: int | msgspec.UnsetType = msgspec.UNSET
    models: list[str] | msgspec.UnsetType = msgspec.UNSET
    budget_usd: float | msgspec.UnsetType | None = msgspec.UNSET  # None: no cap any more
    debug: bool | msgspec.UnsetType = msgspec.UNSET
    substitute: bool | msgspec.UnsetType = msgspec.UNSET

    def applied_to(self, key: ApiKey) -> ApiKey:
        changes = {
            name: getattr(self, name)
            for name in self.__struct_fields__
            if getattr(self, name) is not msgspec.UNSET
        }
        return checked_key(msgspec.structs.replace(key, **changes))


# The most requests or tokens a minute a key may be given: limits are counted in Redis's Lua numbers
# (doubles, exact to 2**53), in SQLite's and PostgreSQL's 64-bit integers.
MAX_PER_MINUTE = 10**15
_MAX_NAME_CHARS = 200


def _name_problem(what: str, name: object) -> str | None:
    """A tenant, tier or model name shows in tables, logs and the ledger: one printable line."""
    if not isinstance(name, str) or not name.strip():
        return f"{what} must not be empty"
    if not name.isprintable() or len(name) > _MAX_NAME_CHARS:
        return f"{what} must be one printable line of at most {_MAX_NAME_CHARS} characters: {name[:40]!r}"
    return None


def checked_key(key: ApiKey) -> ApiKey:
    """``key``, or ValueError naming the first value no store may hold."""
    names = [("tenant", key.tenant), ("tier", key.tier), *(("a model name", m) for m in key.models)]
    for what, name in names:
        if problem := _name_problem(what, name):
            raise ValueError(problem)
    if not (1 <= key.rpm <= MAX_PER_MINUTE and 1 <= key.tpm <= MAX_PER_MINUTE):
        raise ValueError(f"rpm and tpm must be from 1 to {MAX_PER_MINUTE:.0e}")
    if key.budget_usd is not None and not (math.isfinite(key.budget_usd) and key.budget_usd >= 0):
        raise ValueError("budget_usd must be a finite number, 0 or more")
    return key


def new_key(tenant: str, **settings: object) -> tuple[str, ApiKey]:
    """A fresh ``(secret, record)``: a random key_id and secret, ``settings`` as given (checked)."""
    key = ApiKey(
        key_id=secrets.token_hex(_KEY_ID_HEX // 2),
        tenant=tenant,
        created_at=time.time(),
        **settings,  # type: ignore[arg-type]
    )
    return secrets.token_urlsafe(_SECRET_BYTES), checked_key(key)


def parse_key(presented: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, else None; never raises."""
    if len(presented) != _KEY_LENGTH:  # checked first, so a huge input costs nothing
        return None
    match = _KEY.fullmatch(presented)
    return (match[1], match[2]) if match else None


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@functools.lru_cache(maxsize=65536)  # one hash a key, not one a request
def share_key(key_id: str) -> str:
    """The opaque id a region's scheduler shares its queue by (x-nearshore-share-key): a hash of the key
    id, the same from every edge, that names neither the key nor its id."""
    return hashlib.blake2b(key_id.encode(), digest_size=12, person=b"nearshore-share").hexdigest()


# What an unknown key id is compared against: no secret hashes to it (it is not even hex).
_UNKNOWN_DIGEST = "-" * 64


_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id        TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    tier          TEXT NOT NULL,
    rpm           INTEGER NOT NULL,
    tpm           INTEGER NOT NULL,
    models        TEXT NOT NULL,   -- JSON list; [] = all models
    budget_usd    REAL,
    revoked       INTEGER NOT NULL DEFAULT 0,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    debug         INTEGER NOT NULL DEFAULT 0,
    substitute    INTEGER NOT NULL DEFAULT 0
)
"""
# Columns added since the first schema, for key files written by an older release.
_ADDED_COLUMNS = {"debug": "INTEGER NOT NULL DEFAULT 0", "substitute": "INTEGER NOT NULL DEFAULT 0"}
_COLUMNS = (
    "key_id, secret_sha256, tenant, tier, rpm, tpm, models, budget_usd, revoked, created_at, debug, "
    "substitute"
)
_INSERT = (
    f"INSERT INTO api_keys ({_COLUMNS}, updated_at) VALUES (:key_id, :secret_sha256, :tenant, :tier, "
    ":rpm, :tpm, :models, :budget_usd, :revoked, :created_at, :debug, :substitute, :updated_at)"
)


def _row_to_key(row: tuple) -> tuple[ApiKey, str]:
    key_id, digest, tenant, tier, rpm, tpm, models, budget, revoked, created_at, debug, substitute = row
    key = ApiKey(
        key_id=key_id,
        tenant=tenant,
        tier=tier,
        rpm=rpm,
        tpm=tpm,
        models=json.loads(models),
        budget_usd=budget,
        revoked=bool(revoked),
        created_at=created_at,
        debug=bool(debug),
        substitute=bool(substitute),
    )
    return key, digest


_SELECT_ONE = f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ?"
_SETTINGS = ("tier", "rpm", "tpm", "models", "budget_usd", "debug", "substitute")
_UPDATE = (
    f"UPDATE api_keys SET {', '.join(f'{name} = :{name}' for name in _SETTINGS)}, updated_at = :updated_at "
    "WHERE key_id = :key_id"
)


def _settings_row(key: ApiKey) -> dict[str, object]:
    row: dict[str, object] = {name: getattr(key, name) for name in _SETTINGS}
    row.update(key_id=key.key_id, models=json.dumps(key.models))
    return row


def _create_private(path: Path) -> bool:
    """Create the file readable by its owner only (SQLite gives its -wal and -shm files the same mode);
    True when this made it, False when it was there already."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
        return True
    except FileExistsError:
        os.close(os.open(path, os.O_RDWR))  # a folder or a read-only file fails here, with the OS's reason
        return False


class KnownKeys:
    """The in-memory copy of a key table that every request is checked against, whatever holds the table
    (:class:`KeyStore`: a SQLite file; :class:`edge.keys_pg.PgKeyStore`: PostgreSQL). The copy maps
    key_id -> (record, sha256 hex of the secret); the request path reads it without a lock or a query.
    """

    _cache: dict[str, tuple[ApiKey, str]]

    def trusted(self) -> bool:
        """Whether the copy may be used: always for a local file; a remote store's edge stops trusting it
        after a configured time out of reach."""
        return True

    # --- the request path -----------------------------------------------------------------------------

    def authenticate(self, presented: str | None) -> AuthResult:
        """Check a presented key against the in-memory copy; never raises on bad input, never queries."""
        if presented is None or (isinstance(presented, str) and not presented.strip()):
            return AuthResult(None, "missing")
        parsed = parse_key(presented.strip()) if isinstance(presented, str) else None
        if parsed is None:
            return AuthResult(None, "malformed")
        key_id, secret = parsed
        entry = self._cache.get(key_id)
        if not self.trusted() or (entry is None and self.out_of_reach()):
            # A key the copy does not know may have been created while the store was away: not a 401.
            return AuthResult(None, "unavailable")
        # An unknown id is hashed and compared too, so that it costs what a known one does.
        key, digest = entry if entry is not None else (None, _UNKNOWN_DIGEST)
        if not hmac.compare_digest(hash_secret(secret), digest) or key is None:
            return AuthResult(None, "unknown")  # a wrong secret says no more than an unknown key
        if key.revoked:
            return AuthResult(key, "revoked")
        return AuthResult(key, "ok")

    def active(self, key_id: str) -> bool:
        """Whether the copy holds ``key_id`` and it is not revoked (a request in flight under a key that
        is not may not go on)."""
        entry = self._cache.get(key_id)
        return entry is not None and not entry[0].revoked

    def out_of_reach(self) -> bool:
        """Whether the store behind the copy cannot be reached now (a file always can)."""
        return False

    def out_of_reach_s(self) -> float:
        return 0.0

    def active_keys(self) -> int:
        """How many keys in the copy may be used."""
        return sum(1 for key, _digest in self._cache.values() if not key.revoked)

    def status(self) -> str:
        """For the operator's /health: "up", or how long the store has been out of reach."""
        if not self.out_of_reach():
            return "up"
        serving = "serving the keys it knows" if self.trusted() else "refusing every key"
        return f"out of reach for {self.out_of_reach_s():.0f} s ({serving})"


class KeyStore(KnownKeys):
    """The key table in one SQLite file, shared by the edge process and the ``nearshore keys`` CLI.

    One instance per process. :meth:`authenticate` reads only the in-memory copy, from any thread; a lock
    serializes everything that uses the database connection. Writes made through this instance are in
    the copy at once; another process's appear after :meth:`refresh` (the edge runs edge/key_watch.py).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # Whether this open made the file: a new store is empty, and an edge on it answers 401 to all.
        self.created = _create_private(self.path)
        # isolation_level=None: autocommit; each write is one statement, so one transaction.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout = 5000")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute(_SCHEMA)
        add_missing_columns(self._db, "api_keys", _ADDED_COLUMNS)
        self._lock = threading.Lock()  # serializes use of the connection, never taken by authenticate
        # The in-memory copy: key_id -> (record, sha256 hex of the secret). Replaced whole, never mutated,
        # so the request path reads it without a lock.
        self._cache: dict[str, tuple[ApiKey, str]] = {}
        self._data_version = -1
        with self._lock:
            self._reload()

    def __repr__(self) -> str:
        return f"KeyStore({str(self.path)!r}, keys={len(self._cache)})"

    def close(self) -> None:
        self._db.close()

    # --- admin ----------------------------------------------------------------------------------------

    def create(self, tenant: str, **settings: object) -> tuple[str, ApiKey]:
        """Issue a key: ``(plaintext, record)``; ``settings``: :class:`ApiKey`'s other fields. The
        plaintext exists only in the return value."""
        with self._lock:
            while True:
                secret, key = new_key(tenant, **settings)
                row = msgspec.structs.asdict(key)
                row.update(models=json.dumps(key.models), secret_sha256=hash_secret(secret))
                row["updated_at"] = key.created_at
                try:
                    self._db.execute(_INSERT, row)
                    break
                except sqlite3.IntegrityError:  # a key_id collision (1 in 2**48 per pair): draw another
                    continue
            self._committed()
        return f"{KEY_PREFIX}{key.key_id}-{secret}", key

    def update(self, key_id: str, change: KeyChange) -> ApiKey | None:
        """Change a key's limits or rights (never its secret or tenant); None when there is no such key."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")  # read, check and write as one, against other processes
            try:
                row = self._db.execute(_SELECT_ONE, (key_id,)).fetchone()
                if row is None:
                    self._db.execute("ROLLBACK")
                    return None
                key = change.applied_to(_row_to_key(row)[0])
                self._db.execute(_UPDATE, {**_settings_row(key), "updated_at": time.time()})
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._committed()
        return key

    def revoke(self, key_id: str) -> bool:
        """Revoke a key; False when there is no such key or it was already revoked."""
        with self._lock:
            cursor = self._db.execute(
                "UPDATE api_keys SET revoked = 1, updated_at = ? WHERE key_id = ? AND revoked = 0",
                (time.time(), key_id),
            )
            self._committed()
        return cursor.rowcount > 0

    def _committed(self) -> None:
        """After a commit of ours: the copy reloaded (our own commits do not move data_version), and the
        file's other readers told by its modification time, touched now that the commit is visible (the
        WAL's write, which a watcher also sees, comes a moment before: edge/key_watch.py)."""
        self._reload()
        with contextlib.suppress(OSError):  # a reader's copy is still kept fresh by its poll
            os.utime(self.path)

    def list(self) -> list[ApiKey]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, key_id").fetchall()
        return [_row_to_key(row)[0] for row in rows]

    def get(self, key_id: str) -> ApiKey | None:
        with self._lock:
            row = self._db.execute(_SELECT_ONE, (key_id,)).fetchone()
        return _row_to_key(row)[0] if row else None

    # --- keeping the copy fresh (off the request path) -------------------------------------------------

    def changed(self) -> bool:
        """Whether another process committed to the file since the copy was loaded: one cheap query.

        ``PRAGMA data_version`` moves when another connection commits; our own writes reload at once.
        """
        with self._lock:
            return self._db.execute("PRAGMA data_version").fetchone()[0] != self._data_version

    def refresh(self) -> bool:
        """Reload the copy if the file changed; True when it did. Safe to call from a worker thread."""
        with self._lock:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version == self._data_version:
                return False
            self._reload(version)
        return True

    def _reload(self, version: int | None = None) -> None:
        # Called with the lock held. data_version is read before the rows: a commit in between only causes
        # one extra reload later.
        if version is None:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM api_keys").fetchall()
        self._cache = {row[0]: _row_to_key(row) for row in rows}
        self._data_version = version


async def store_call(store: KnownKeys, method: str, *args: Any, **kwargs: Any) -> Any:
    """One admin operation (create, update, revoke, list, get, close) on either store: the SQLite one in a
    worker thread (it blocks), the PostgreSQL one (edge/keys_pg.py) awaited."""
    operation = getattr(store, method)
    if isinstance(store, KeyStore):
        return await asyncio.to_thread(operation, *args, **kwargs)
    return await operation(*args, **kwargs)
