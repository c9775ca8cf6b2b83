"""The key table in PostgreSQL (issue 35, item 1), against a real server: every change reaches another
process's copy by push, an old record never comes back, the store out of reach is served from the copy
for a bounded time, and a store that cannot be used says so in one line naming the setting."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable

import pytest

from edge.keys import KeyChange
from edge.keys_pg import KeyStoreError, KeysUnavailable, PgKeyStore
from nearshore.children import nearshore_argv
from tests.conftest import Postgres

pytestmark = pytest.mark.slow


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait for ``condition`` (checked every few ms), failing after a bound far above what it needs."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)


async def watched(url: str, grace_s: float = 300.0) -> tuple[PgKeyStore, asyncio.Task]:
    """A store as an edge holds it: the copy loaded, its watcher running."""
    store = await PgKeyStore(url, grace_s).open()
    return store, asyncio.create_task(store.watch())


async def stop(store: PgKeyStore, task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await store.close()


async def test_every_change_reaches_another_copy_by_push(postgres: Postgres):
    admin = await PgKeyStore(postgres.url).open()
    edge, task = await watched(postgres.url)
    try:
        plaintext, key = await admin.create("acme", rpm=5, models=["m1"])
        await until(lambda: edge.authenticate(plaintext).reason == "ok")
        assert edge.authenticate(plaintext).key == key

        changed = await admin.update(key.key_id, KeyChange(rpm=2, models=[], budget_usd=1.5))
        assert changed is not None and (changed.rpm, changed.models, changed.budget_usd) == (2, [], 1.5)
        await until(lambda: edge.authenticate(plaintext).key.rpm == 2)
        assert edge.authenticate(plaintext).key == changed

        # A change made outside Nearshore (plain SQL) is pushed the same way: the trigger sends it.
        postgres.server.sql(
            f"UPDATE nearshore_api_keys SET tier = 'gold' WHERE key_id = '{key.key_id}'",
            database=postgres.url.rsplit("/", 1)[1],
        )
        await until(lambda: edge.authenticate(plaintext).key.tier == "gold")

        assert await admin.revoke(key.key_id) and not await admin.revoke(key.key_id)
        await until(lambda: edge.authenticate(plaintext).reason == "revoked")
        assert not edge.active(key.key_id)
        assert await admin.update("000000000000", KeyChange(rpm=3)) is None
        assert [k.key_id for k in await admin.list()] == [key.key_id]
    finally:
        await stop(edge, task)
        await admin.close()


async def test_a_burst_of_changes_leaves_every_copy_at_the_tables_last_state(postgres: Postgres):
    admin = await PgKeyStore(postgres.url).open()
    edges = [await watched(postgres.url) for _ in range(2)]
    try:
        plaintext, key = await admin.create("acme")
        for rpm in range(1, 61):  # notices arrive in batches while reads are in flight: the last one wins
            await admin.update(key.key_id, KeyChange(rpm=rpm))
        last = await admin.get(key.key_id)
        assert last is not None and last.rpm == 60
        for edge, _task in edges:
            await until(lambda edge=edge: edge.authenticate(plaintext).key == last)
        await asyncio.sleep(0.2)  # nothing later may bring an older record back
        assert all(edge.authenticate(plaintext).key == last for edge, _ in edges)
    finally:
        for edge, task in edges:
            await stop(edge, task)
        await admin.close()


async def test_out_of_reach_known_keys_are_served_for_the_grace_then_nothing(postgres: Postgres):
    admin = await PgKeyStore(postgres.url).open()
    known, _ = await admin.create("acme")
    await admin.close()
    patient, patient_task = await watched(postgres.url, grace_s=300)
    strict, strict_task = await watched(postgres.url, grace_s=0.5)
    try:
        postgres.server.stop()
        await until(lambda: patient.out_of_reach() and strict.out_of_reach())
        never_seen = "ns-0123456789ab-" + "A" * 43
        assert patient.authenticate(known).reason == "ok"  # served from the copy
        assert patient.authenticate(never_seen).reason == "unavailable"  # may exist: not a 401
        assert patient.status().startswith("out of reach")
        with pytest.raises(KeysUnavailable):  # the admin API's 503, not a 500
            await patient.revoke("000000000000")
        await until(lambda: not strict.trusted())
        assert strict.authenticate(known).reason == "unavailable"  # past its grace: nothing is served

        postgres.server.start()
        await until(lambda: not patient.out_of_reach() and not strict.out_of_reach())
        assert strict.authenticate(known).reason == "ok" and strict.reloads == 2
        # Changes after the return are pushed again.
        admin = await PgKeyStore(postgres.url).open()
        fresh, _ = await admin.create("acme")
        await admin.close()
        await until(lambda: patient.authenticate(fresh).reason == strict.authenticate(fresh).reason == "ok")
    finally:
        await stop(patient, patient_task)
        await stop(strict, strict_task)


async def test_a_store_that_cannot_be_used_says_why_in_one_line(postgres: Postgres):
    server, url = postgres.server, postgres.url
    cases = {
        "refused the credentials": (url, "not-the-password"),
        "cannot be reached": (url.replace(f":{server.port}/", ":1/"), server.password),
        "does not exist": (url.rsplit("/", 1)[0] + "/no_such_db", server.password),
    }
    for expected, (target, password) in cases.items():
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PGPASSWORD", password)
            with pytest.raises(KeyStoreError) as error:
                await PgKeyStore(target).open()
        message = str(error.value)
        assert message.startswith("keys.postgres_url: ") and expected in message and "\n" not in message

    # A table from another release: its version is named, nothing is changed.
    await (await PgKeyStore(url).open()).close()
    server.sql("UPDATE nearshore_schema SET version = 99", database=url.rsplit("/", 1)[1])
    with pytest.raises(KeyStoreError, match=r"from another release \(schema version 99"):
        await PgKeyStore(url).open()
    with pytest.raises(KeyStoreError, match="holds a password"):
        PgKeyStore(url.replace("nearshore@", "nearshore:secret@"))


def test_the_cli_manages_the_table_and_an_edge_with_a_wrong_password_stops_in_one_line(
    postgres: Postgres, tmp_path
):
    def keys(*args: str) -> subprocess.CompletedProcess[str]:
        argv = nearshore_argv("keys", *args, "--postgres", postgres.url)
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    created = keys("create", "--tenant", "acme", "--rpm", "7")
    assert created.returncode == 0, created.stderr
    key_id = created.stdout.split("key_id: ")[1].strip()
    assert keys("update", key_id, "--rpm", "3", "--model", "m1").returncode == 0
    listed = keys("list").stdout
    assert key_id in listed and " 3 " in listed and "m1" in listed
    assert keys("revoke", key_id).stdout.strip() == f"revoked {key_id}"
    gone = keys("update", "000000000000", "--rpm", "3")
    assert gone.returncode == 1 and gone.stderr.strip() == "nearshore: no such key: 000000000000"

    config = tmp_path / "edge.toml"
    config.write_text(
        f'ledger_db = "{tmp_path / "ledger.sqlite3"}"\n[keys]\nbackend = "postgres"\n'
        f'postgres_url = "{postgres.url}"\n[metrics]\nport = 0\n'
        '[[regions]]\nname = "r"\nurl = "http://127.0.0.1:9"\n'
    )
    edge = subprocess.run(
        nearshore_argv("edge", "--config", str(config), "--port", "0"),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PGPASSWORD": "wrong"},
        check=False,
    )
    lines = edge.stderr.strip().splitlines()
    assert edge.returncode != 0 and "Traceback" not in edge.stderr, edge.stderr
    assert "keys.postgres_url" in lines[-1] and "refused the credentials" in lines[-1], edge.stderr
