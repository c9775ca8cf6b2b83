"""The admin API's key operations over a SQLite key store (the PostgreSQL store's are in
test_keys_fleet.py): a token is needed, bad bodies are 400s naming the field, and each operation lands in
the store as `nearshore keys` would make it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from edge.keys import KeyStore
from edge.keys_admin import MIN_TOKEN_CHARS, TOKEN_ENV, add_admin_routes, admin_token
from nearshore.httpkit import openai_errors

TOKEN = "t" * MIN_TOKEN_CHARS
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[TestClient, KeyStore]]:
    store = KeyStore(tmp_path / "keys.sqlite3")
    app = web.Application(middlewares=[openai_errors])
    add_admin_routes(app, store, TOKEN)
    async with TestClient(TestServer(app)) as client:
        yield client, store
    store.close()


async def test_keys_are_made_changed_and_revoked_through_the_api(api):
    client, store = api
    made = await client.post("/admin/keys", json={"tenant": "acme", "rpm": 5, "models": ["m1"]}, headers=AUTH)
    assert made.status == 201
    body = await made.json()
    key_id = body["record"]["key_id"]
    assert store.authenticate(body["key"]).key == store.get(key_id)  # the plaintext works, shown once

    changed = await client.patch(f"/admin/keys/{key_id}", json={"rpm": 2, "budget_usd": 1.5}, headers=AUTH)
    assert changed.status == 200 and (await changed.json())["rpm"] == 2
    assert store.get(key_id).budget_usd == 1.5 and store.get(key_id).models == ["m1"]
    listed = await (await client.get("/admin/keys", headers=AUTH)).json()
    assert [k["key_id"] for k in listed["data"]] == [key_id] and "secret_sha256" not in str(listed)

    revoked = await client.delete(f"/admin/keys/{key_id}", headers=AUTH)
    assert revoked.status == 200 and (await revoked.json())["revoked"] is True
    assert store.authenticate(body["key"]).reason == "revoked"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        ("POST", "/admin/keys", {"tenant": "acme", "rpm": 0}, 400, None),
        ("POST", "/admin/keys", {"tenant": "acme", "secret": "x"}, 400, "secret"),
        ("POST", "/admin/keys", {"rpm": 5}, 400, None),  # no tenant
        ("POST", "/admin/keys", {"tenant": "a\nb"}, 400, None),
        ("PATCH", "/admin/keys/000000000000", {"rpm": 3}, 404, "key_id"),
        ("PATCH", "/admin/keys/{key_id}", {"tenant": "other"}, 400, "tenant"),  # a tenant never changes
        ("PATCH", "/admin/keys/{key_id}", {"tpm": 10**16}, 400, None),
        ("DELETE", "/admin/keys/000000000000", None, 404, "key_id"),
        ("GET", "/admin/keys/000000000000", None, 404, "key_id"),
    ],
)
async def test_bad_requests_are_clear_and_change_nothing(api, method, path, body, status, param):
    client, store = api
    _, key = store.create("acme", rpm=7)
    before = store.list()
    response = await client.request(method, path.format(key_id=key.key_id), json=body, headers=AUTH)
    assert response.status == status
    error = (await response.json())["error"]
    assert error["message"] and (param is None or error["param"] == param), error
    assert store.list() == before


async def test_no_token_no_entry(api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    client, _ = api
    for headers in ({}, {"Authorization": "Bearer " + "x" * MIN_TOKEN_CHARS}, {"Authorization": TOKEN}):
        response = await client.get("/admin/keys", headers=headers)
        assert response.status == 401
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert admin_token("") == ""  # neither set: the routes are not added at all
    (tmp_path / "token").write_text("short\n")
    with pytest.raises(ValueError, match=r"admin\.token_file: the admin token must be at least"):
        admin_token(str(tmp_path / "token"))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert admin_token(str(tmp_path / "token")) == TOKEN  # the environment wins
