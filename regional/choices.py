"""One request's choices (``n``): each its own generation in the engine, batched like any other sequences,
streamed as they come (each chunk names its choice's index) or answered together.

A seeded request draws choice ``i`` with seed ``seed + i``, so each choice is reproducible on its own and
the choices differ; greedy choices are alike, as OpenAI's are. The usage counts the prompt once and every
choice's completion tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from aiohttp import web

from nearshore.httpkit import close_unframed, request_id_of
from nearshore.protocol import sse
from nearshore.protocol.errors import ApiError
from nearshore.protocol.schemas import FinishReason, Usage
from regional.engine import Logprobs
from regional.service import Generation, Prepared


class Chunks(Protocol):
    """How one choice's stream is written (chat: :class:`regional.chat_reply.ChatReply`)."""

    include_usage: bool

    def first(self, generation: Generation) -> bytes: ...

    def text(self, text: str, scored: list[Logprobs]) -> bytes: ...

    def end(self, finish: FinishReason) -> bytes: ...

    def usage(self, usage: Usage) -> bytes: ...


def choice_requests(prepared: Prepared, n: int) -> list[Prepared]:
    """The prepared request of each choice: choice ``i`` seeded ``seed + i`` when the request has a seed."""
    if n == 1:
        return [prepared]
    seed = prepared.sampling.seed
    return [
        dataclasses.replace(
            prepared,
            sampling=prepared.sampling
            if seed is None
            else dataclasses.replace(prepared.sampling, seed=seed + i),
        )
        for i in range(n)
    ]


def total_usage(generations: Sequence[Generation]) -> Usage:
    first = generations[0].usage
    completion = sum(g.usage.completion_tokens for g in generations)
    return Usage.of(first.prompt_tokens, completion, first.prompt_tokens_details.cached_tokens)


async def collect(generation: Generation) -> tuple[str, FinishReason, list[Logprobs]]:
    parts: list[str] = []
    scored: list[Logprobs] = []
    finish: FinishReason = "stop"
    async for text, reason, logprobs in generation:
        parts.append(text)
        scored += logprobs
        finish = reason or finish
    return "".join(parts), finish, scored


async def collect_all(generations: Sequence[Generation]) -> list[tuple[str, FinishReason, list[Logprobs]]]:
    if len(generations) == 1:
        return [await collect(generations[0])]
    tasks = [asyncio.ensure_future(collect(g)) for g in generations]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:  # one failed (or the client left): the others' sequences are aborted
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


_END = object()


class _Recoded(web.StreamResponse):
    """A stream whose every write is recoded first (and skipped when nothing is left of it)."""

    def __init__(self, recode: Callable[[bytes], bytes], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._recode = recode

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if recoded := self._recode(bytes(data)):
            await super().write(recoded)


async def stream(
    request: web.Request,
    runs: Sequence[tuple[Generation, Chunks]],
    recode: Callable[[bytes], bytes] | None = None,
) -> web.StreamResponse:
    """Relay every choice's tokens as SSE, as they come. Headers go out with the first token of any
    choice, so they carry queue and prefill times and an error before it is still a plain HTTP error. A
    client that leaves cancels this handler; each generation's cleanup aborts its sequence. ``recode``:
    what the client gets instead of each write (the Responses API's events)."""
    headers = {**sse.HEADERS, "x-request-id": request_id_of(request)}
    response = web.StreamResponse(headers=headers) if recode is None else _Recoded(recode, headers=headers)
    close_unframed(request, response)
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, generation: Generation) -> None:
        try:
            async for item in generation:
                await queue.put((i, item))
        except Exception as exc:  # every failure reaches the writer, which would otherwise wait forever
            await queue.put((i, exc))
        else:
            await queue.put((i, _END))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, (g, _chunks) in enumerate(runs)]
    opened = [False] * len(runs)
    try:
        running = len(runs)
        while running:
            i, item = await queue.get()
            generation, chunks = runs[i]
            if item is _END:
                running -= 1
                continue
            if isinstance(item, Exception):
                if not response.prepared or not isinstance(item, ApiError):
                    raise item
                await response.write(sse.error(item))
                break
            text, finish, scored = item
            if not response.prepared:
                response.headers["Server-Timing"] = generation.timings.server_timing()
                await response.prepare(request)
            if not opened[i]:
                opened[i] = True
                if first := chunks.first(generation):
                    await response.write(first)
            if text or scored:
                await response.write(chunks.text(text, scored))
            if finish is not None:
                await response.write(chunks.end(finish))
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
    if runs[0][1].include_usage:
        await response.write(runs[0][1].usage(total_usage([g for g, _ in runs])))
    await response.write(sse.DONE)
    await response.write_eof()
    return response
