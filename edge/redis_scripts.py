"""Lua scripts on Redis, the calls of one event-loop turn sent together (the shared limits and budgets).

A shared rate limit costs each request two scripts (its admission, then its settle). One call at a time
through redis-py costs about 75 us of the edge's CPU each (its command, connection and reply machinery),
about a third of that when ten go in one pipeline. So the calls made in one turn of the loop, by every
request that reached that point in it, go to Redis in one pipeline (one write, one read); a call alone goes
as it is. Each caller still awaits its own reply: nothing is sent later than it would have been, and a
Redis that fails fails every call of the batch, each caller deciding (the limiter falls back to local
limits). A script Redis does not know (restarted, flushed) is sent again with its source, which also
loads it; or, for a script that watches for that (``Script.of(..., watches_resets=True)``: the limiter's
admission, its source made this process's own), is loaded and its caller told (:class:`StoreReset`) before
the script runs: a Redis that lost its scripts may have lost its data too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from edge.lua_script import Script


class StoreReset(Exception):
    """Redis did not know a script that watches for resets: it restarted (or its scripts were flushed) since
    this process last ran it. The script was not run; it is loaded again for the next call."""


@dataclass(frozen=True, slots=True)
class _Call:
    script: Script
    keys: Sequence[str]
    args: Sequence[object]
    reply: asyncio.Future[Any]


class ScriptRunner:
    """``await runner.run(script, keys, args)``: the script's reply, or the error Redis or the connection
    raised."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._waiting: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()
        self.batches = 0  # pipelines sent (for tests and the bench: how often calls were coalesced)

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[object]) -> Any:
        loop = asyncio.get_running_loop()
        call = _Call(script, keys, args, loop.create_future())
        if not self._waiting:
            loop.call_soon(self._send_waiting)  # after every request this turn has reached this point
        self._waiting.append(call)
        return await call.reply

    def _send_waiting(self) -> None:
        calls, self._waiting = self._waiting, []
        task = asyncio.get_running_loop().create_task(self._send(calls))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, calls: list[_Call]) -> None:
        try:
            if len(calls) == 1:
                call = calls[0]
                _settle(call.reply, await self._one(call))
                return
            self.batches += 1
            async with self._redis.pipeline(transaction=False) as pipe:
                for call in calls:
                    pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
                replies = await pipe.execute(raise_on_error=False)
        except Exception as exc:  # the connection, a timeout: every call of the batch fails alike
            for call in calls:
                _fail(call.reply, exc)
            return
        loaded: set[str] = set()
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, NoScriptError) and call.script.watches_resets:
                try:  # every such call of the batch is told, none run before its caller knows
                    if call.script.sha not in loaded:
                        await self._redis.script_load(call.script.source)
                        loaded.add(call.script.sha)
                    reply = StoreReset("Redis did not know this process's scripts (restarted or flushed)")
                except Exception as exc:
                    reply = exc
            elif isinstance(reply, NoScriptError):
                try:
                    reply = await self._one(call)
                except Exception as exc:
                    _fail(call.reply, exc)
                    continue
            if isinstance(reply, Exception):
                _fail(call.reply, reply)
            else:
                _settle(call.reply, reply)

    async def _one(self, call: _Call) -> Any:
        keys, args, script = call.keys, call.args, call.script
        try:
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            if script.watches_resets:
                await self._redis.script_load(script.source)
                raise StoreReset("Redis did not know this process's scripts (restarted or flushed)") from None
            return await self._redis.eval(script.source, len(keys), *keys, *args)  # also caches it

    async def close(self) -> None:
        """Wait for the batches on their way (their callers are waiting for them)."""
        await asyncio.gather(*self._sending, return_exceptions=True)


def _settle(reply: asyncio.Future[Any], value: Any) -> None:
    if not reply.done():  # its request may have been cancelled meanwhile
        reply.set_result(value)


def _fail(reply: asyncio.Future[Any], exc: BaseException) -> None:
    if not reply.done():
        reply.set_exception(exc)
