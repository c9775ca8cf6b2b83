"""The bill's shipper stopped mid-batch (edge/ledger_pg.py): a shutdown cancels the shipping task wherever it
is, perhaps inside a batch, which leaves its connection mid-operation; the last attempt then takes a
connection of its own (on the old one the edge crashed at shutdown: "another operation is in progress"),
and every row arrives."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest

from edge.ledger import Ledger
from edge.ledger_pg import FleetLedger
from tests.conftest import Postgres
from tests.edge.test_ledger import usage

pytestmark = pytest.mark.slow


async def test_a_shutdown_that_cancels_a_batch_midway_still_ships_every_row(
    postgres: Postgres, tmp_path: Path
):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    fleet = FleetLedger(tmp_path / "ledger.sqlite3", postgres.url, "lagos")
    try:
        for i in range(3000):
            await ledger.record(usage(f"r-{i}", ts=time.time()))
        await fleet.check()  # connected, as a running edge is
        shipping = asyncio.ensure_future(fleet.ship_all())
        while fleet._conn is None or not fleet._conn.is_in_transaction():  # inside a batch
            await asyncio.sleep(0)
        shipping.cancel()
        await asyncio.gather(shipping, return_exceptions=True)
        await fleet.close()  # raises nothing; ships the rest
        conn = await asyncpg.connect(postgres.url)
        try:
            shipped = await conn.fetchval("SELECT count(DISTINCT request_id) FROM nearshore_usage")
        finally:
            await conn.close()
        assert shipped == 3000
    finally:
        await ledger.close()


async def test_a_connection_left_mid_operation_does_not_end_the_shipper(postgres: Postgres, tmp_path: Path):
    """A batch cut at its timeout can leave the connection mid-operation, and the next batch's BEGIN then
    fails with asyncpg's InternalClientError (seen under load): the shipper drops that connection and goes
    on, where it used to end for the edge's life with every later row left behind."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    fleet = FleetLedger(tmp_path / "ledger.sqlite3", postgres.url, "lagos")
    real_connect = fleet._connect
    broken: list[object] = []

    class MidOperation:
        """A connection whose last operation never finished."""

        def transaction(self):
            raise asyncpg.InternalClientError(
                "cannot switch to state 15; another operation (2) is in progress"
            )

        def terminate(self) -> None:
            broken.append(self)

    async def first_connection_broken():
        if not broken:
            fleet._conn = MidOperation()  # type: ignore[assignment]
            return fleet._conn
        return await real_connect()

    fleet._connect = first_connection_broken  # type: ignore[method-assign]
    shipping = asyncio.ensure_future(fleet.run())
    try:
        for i in range(20):
            await ledger.record(usage(f"r-{i}", ts=time.time()))
        # Rows count as shipped batch by batch; the shipper says it is reachable once the round has ended.
        while fleet.shipped_rows < 20 or not fleet.reachable:
            assert not shipping.done(), shipping.exception()
            await asyncio.sleep(0.02)
        assert len(broken) == 1 and fleet.reachable  # the broken connection cut, then a good one shipped
    finally:
        shipping.cancel()
        await asyncio.gather(shipping, return_exceptions=True)
        await fleet.close()
        await ledger.close()
