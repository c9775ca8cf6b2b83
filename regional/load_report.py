"""The region's load as it tells edges: ``x-nearshore-load`` on every response and ``load`` in /health.

Every response carries the report, so it is made at most once per ``max_age_s`` from one engine snapshot
and reused by every response sent meanwhile: a burst of requests does not queue on the engine's lock. The
engine's lifecycle state (loading, ready, failed) is read on every response and a change makes a new report.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from nearshore.protocol.headers import LOAD
from nearshore.protocol.load import LoadReport, LoadState, format_load
from regional.engine import Engine, EngineStats

MAX_AGE_S = 0.05

# The engine's lifecycle as the router reads it; a state it does not know reads as failed (never routed to).
_LOAD_STATE: dict[str, LoadState] = {
    "ready": "ready",
    "loading": "loading",
    "unloaded": "unloaded",
    "failed": "failed",
}


def load_of(stats: EngineStats) -> LoadReport:
    kv_usage = stats.kv_tokens_used / stats.kv_tokens_total if stats.kv_tokens_total > 0 else 0.0
    tokens_per_s = stats.tokens_per_s if math.isfinite(stats.tokens_per_s) else 0.0
    return LoadReport(
        state=_LOAD_STATE.get(stats.state, "failed"),
        running=max(stats.running, 0),
        waiting=max(stats.waiting, 0),
        capacity=max(stats.capacity, 0),
        kv_usage=min(max(kv_usage, 0.0), 1.0),
        tokens_per_s=max(tokens_per_s, 0.0),
        max_choices=max(stats.max_choices, 0),
        prefill_ms_per_token=max(stats.prefill_ms_per_token, 0.0),
    )


class LoadReporter:
    """The latest report and its header value; used on the event loop only."""

    def __init__(self, engine: Engine, max_age_s: float = MAX_AGE_S) -> None:
        self.engine = engine
        self.max_age_s = max_age_s
        self._made_at_s = -math.inf
        self._report = LoadReport()
        self._header = format_load(self._report)

    def current(self) -> tuple[LoadReport, str]:
        now_s = time.monotonic()
        # A lifecycle change (loaded, failed) is told at once, not max_age_s later: a readiness probe that
        # answers "ready" must not carry "loading" in its own head (the state needs no lock to read).
        moved = _LOAD_STATE.get(self.engine.state, "failed") != self._report.state
        if moved or now_s - self._made_at_s >= self.max_age_s:
            self._report = load_of(self.engine.stats())
            self._header = format_load(self._report)
            self._made_at_s = now_s
        return self._report, self._header


ResponseSignal = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


def load_header(reporter: LoadReporter) -> ResponseSignal:
    """An ``on_response_prepare`` handler: every response's head (answers, streams, errors, probes) gets
    the report as it is when the head is sent."""

    async def add_load(_request: web.Request, response: web.StreamResponse) -> None:
        response.headers[LOAD] = reporter.current()[1]

    return add_load
