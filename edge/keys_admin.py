"""The key operations of ``nearshore keys`` over HTTP, on the operator's listener (never the public port),
for operators' own tooling: list, create, show, change and revoke keys in the edge's store (a PostgreSQL
store then tells every edge of the city at once).

Each call needs ``Authorization: Bearer <admin token>``; the token is read at start from the environment
(``NEARSHORE_ADMIN_TOKEN``) or from ``admin.token_file`` (a mounted Secret), never from config text. With
no token configured the routes do not exist (404), as on an edge that has none.

    GET    /admin/keys              every key (never a secret)
    POST   /admin/keys              {"tenant", "tier", "rpm", "tpm", "models", "budget_usd", ...} -> 201,
                                    {"key": the plaintext (shown this once), "record": {...}}
    GET    /admin/keys/{key_id}     one key
    PATCH  /admin/keys/{key_id}     {"rpm": 10, "budget_usd": null, ...}: only the fields given change
    DELETE /admin/keys/{key_id}     revoke it (the row stays: the ledger names it)
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from edge.keys import ApiKey, KeyChange, KeySettings, KnownKeys, store_call
from nearshore.httpkit import read_json
from nearshore.protocol.errors import INVALID_API_KEY, INVALID_REQUEST, KEYS_UNAVAILABLE, NOT_FOUND, ApiError

TOKEN_ENV = "NEARSHORE_ADMIN_TOKEN"
# Shorter tokens are refused at start: the admin API can issue keys.
MIN_TOKEN_CHARS = 24

ADMIN_STORE = web.AppKey("admin_store", KnownKeys)
ADMIN_TOKEN = web.AppKey("admin_token", str)


_new_key = msgspec.json.Decoder(KeySettings)
_change = msgspec.json.Decoder(KeyChange)


def admin_token(token_file: str) -> str:
    """The admin token from the environment or ``token_file`` ("" when neither is set); ValueError naming
    the source when it is too short to be a secret or the file cannot be read."""
    source, token = TOKEN_ENV, os.environ.get(TOKEN_ENV, "")
    if not token and token_file:
        source = "admin.token_file"
        try:
            token = Path(token_file).expanduser().read_text().strip()
        except OSError as exc:
            raise ValueError(f"admin.token_file: {exc.strerror or exc}: {token_file}") from None
    if token and (len(token) < MIN_TOKEN_CHARS or not token.isprintable()):
        raise ValueError(f"{source}: the admin token must be at least {MIN_TOKEN_CHARS} printable characters")
    return token


def add_admin_routes(app: web.Application, store: KnownKeys, token: str) -> None:
    """Serve the key API on ``app`` (the operator's listener) when a token is configured."""
    if not token:
        return
    app[ADMIN_STORE] = store
    app[ADMIN_TOKEN] = token
    app.router.add_get("/admin/keys", list_keys)
    app.router.add_post("/admin/keys", create_key)
    app.router.add_get("/admin/keys/{key_id}", show_key)
    app.router.add_patch("/admin/keys/{key_id}", change_key)
    app.router.add_delete("/admin/keys/{key_id}", revoke_key)


async def _call(store: KnownKeys, method: str, *args: Any, **kwargs: Any) -> Any:
    """A store operation: a value no store may hold is a 400, the store out of reach a 503 to retry."""
    try:
        return await store_call(store, method, *args, **kwargs)
    except ConnectionError as exc:
        raise ApiError(KEYS_UNAVAILABLE, f"The key store is out of reach: {exc}", retry_after_s=5) from None
    except ValueError as exc:
        raise ApiError(INVALID_REQUEST, str(exc)) from None


def _authorized(request: web.Request) -> KnownKeys:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), request.app[ADMIN_TOKEN].encode()
    ):
        raise ApiError(INVALID_API_KEY, "A valid admin token is needed (Authorization: Bearer TOKEN).")
    return request.app[ADMIN_STORE]


def _record(key: ApiKey) -> dict[str, Any]:
    return msgspec.to_builtins(key)


def _missing(key_id: str) -> ApiError:
    return ApiError(NOT_FOUND, f"No such key: {key_id}", param="key_id")


async def list_keys(request: web.Request) -> web.Response:
    keys = await _call(_authorized(request), "list")
    return web.json_response({"object": "list", "data": [_record(key) for key in keys]})


async def create_key(request: web.Request) -> web.Response:
    store = _authorized(request)
    body = await read_json(request, _new_key)
    settings = msgspec.structs.asdict(body)
    tenant = settings.pop("tenant")
    plaintext, key = await _call(store, "create", tenant, **settings)
    return web.json_response({"key": plaintext, "record": _record(key)}, status=201)


async def show_key(request: web.Request) -> web.Response:
    key_id = request.match_info["key_id"]
    key = await _call(_authorized(request), "get", key_id)
    if key is None:
        raise _missing(key_id)
    return web.json_response(_record(key))


async def change_key(request: web.Request) -> web.Response:
    store = _authorized(request)
    key_id = request.match_info["key_id"]
    change = await read_json(request, _change)
    key = await _call(store, "update", key_id, change)
    if key is None:
        raise _missing(key_id)
    return web.json_response(_record(key))


async def revoke_key(request: web.Request) -> web.Response:
    store = _authorized(request)
    key_id = request.match_info["key_id"]
    await _call(store, "revoke", key_id)
    key = await _call(store, "get", key_id)
    if key is None:
        raise _missing(key_id)
    return web.json_response(_record(key))
