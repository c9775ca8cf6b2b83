"""One timer per stream: heartbeats while the region is quiet, the client cut off when it stops reading, and
the region's stream ended when it is late by the relay's clock (:class:`edge.sse_relay.SseRelay`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from edge.sse_relay import SseRelay
from nearshore.protocol import sse


class StreamWatchdog:
    """One timer per stream, instead of a task and a timeout per write or read.

    When nothing has gone to the client for ``heartbeat_s``, it sends an SSE comment (the first one
    commits the response if the region has not answered yet), so idle hops stay open during a long
    prefill. When the client has not taken a write for ``write_timeout_s``, it cuts the client off: the
    handler then ends, which cancels the upstream request. When the region is late by the relay's clock
    (its first token, a stall, the request's deadline), it ends the relay with an error.
    """

    def __init__(
        self,
        relay: SseRelay,
        heartbeat_s: float,
        write_timeout_s: float,
        commit: Callable[[], Awaitable[None]],
        cut_off: Callable[[], None],
        tick_s: float,
    ) -> None:
        self.relay = relay
        self.heartbeat_s = heartbeat_s
        self.write_timeout_s = write_timeout_s
        self.commit = commit
        self.cut_off = cut_off
        self.tick_s = min(heartbeat_s / 2, write_timeout_s / 2, tick_s)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._beat: asyncio.Task | None = None

    def start(self) -> None:
        self._timer = self._loop.call_later(self.tick_s, self._check)

    def _check(self) -> None:
        now = time.monotonic()
        relay = self.relay
        if relay.write_started and now - relay.write_started >= self.write_timeout_s:
            self._timer = None
            self.cut_off()
            return
        if relay.read_started and not relay.write_started:
            why, expired = relay.overdue(now)
            if why:
                relay.stall(why, expired)
        idle = not relay.write_started and now - relay.last_write >= self.heartbeat_s
        if idle and (self._beat is None or self._beat.done()):
            self._beat = self._loop.create_task(self._heartbeat())
        self._timer = self._loop.call_later(self.tick_s, self._check)

    async def _heartbeat(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.commit()
            await self.relay.write(sse.comment("keep-alive"), content=False)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._beat is not None and not self._beat.done():
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
