"""What one edge process holds for all its requests: config, keys, limits, budgets, ledger, stored
responses, upstreams."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from cache.response_cache import ResponseCache
from edge.billing import PriceTable
from edge.cache_audit import Auditor
from edge.config import EdgeConfig
from edge.degraded_policy import DegradedTier
from edge.inflight import InFlight
from edge.keys import KnownKeys
from edge.ledger import Ledger
from edge.limits import RateLimiter, StandingRefusals
from edge.metrics import EdgeMetrics
from edge.pool_gate import PoolGate
from edge.response_store import ResponseStore
from edge.spend_budget import BudgetBook, Budgets
from edge.token_count import TokenCounter
from edge.upstream import UpstreamPool
from geo.locate import Locator
from geo.rightsize import SizeAlias

if TYPE_CHECKING:
    from edge.ledger_pg import FleetLedger  # asyncpg is imported only where a fleet bill is configured


@dataclass(eq=False)
class EdgeState:
    config: EdgeConfig
    keys: KnownKeys
    limiter: RateLimiter
    ledger: Ledger
    responses: ResponseStore  # /v1/responses kept with `store`
    prices: PriceTable
    counter: TokenCounter
    pool: UpstreamPool
    metrics: EdgeMetrics = field(default_factory=EdgeMetrics)
    budget: Budgets = None  # type: ignore[assignment]  # a BudgetBook unless given (shared through Redis)
    cache: ResponseCache | None = None  # the response cache (the cache stage), None when off
    cache_off: str = ""  # why there is no cache
    auditor: Auditor | None = None  # the cache's live audit (with the cache)
    locator: Locator | None = None  # where clients are (the route stage needs it)
    aliases: dict[str, SizeAlias] = field(default_factory=dict)  # size aliases by name (the rightsize stage)
    gates: dict[str, PoolGate] = field(default_factory=dict)  # per-pool in-flight limits (the gate stage)
    degraded: DegradedTier | None = None  # the local regions' policy (the cut stage); None: no local region
    background: set[asyncio.Task] = field(default_factory=set)
    inflight: InFlight = field(default_factory=InFlight)  # journeys running, which the edge may end
    refusals: StandingRefusals = field(default_factory=StandingRefusals)  # RPM refusals that still stand
    fleet_ledger: FleetLedger | None = None  # the city's one bill in PostgreSQL (edge/ledger_pg.py)
    admin_token: str = ""  # the key API on the operator's listener (edge/keys_admin.py); "": none

    def __post_init__(self) -> None:
        if self.budget is None:
            self.budget = BudgetBook(self.ledger.spent_usd)

    def in_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run ``coro`` to its end even if the request that started it is cancelled; awaited at shutdown."""
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task


EDGE = web.AppKey("edge", EdgeState)
