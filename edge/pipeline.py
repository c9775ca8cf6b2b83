"""The edge's journey as named stages, and its one exit.

A request passes through the stages in order (authenticate, parse, rightsize, admit, cut, cache, route,
gate, forward, relay, continue; see :mod:`edge.stages`); each reads the records of the stages before it on
the :class:`~edge.journey.Journey` and produces its own, and may end it by returning a reply (a cache hit
would) or raising an :class:`ApiError`. A stage may instead return a :class:`~edge.journey.Racing` reply
(one on its way, that may answer before the region does): the pipeline hands it to the next stage that
``races``, as an argument. Whatever happens, :func:`run_journey` leaves by one door: it records an outcome
if no stage did, runs the cleanups, then the closing stages in order, whatever ended the journey (store:
keep the answer; settle: bill the request once), and only then sends the answer's last bytes. While the
stages run, the edge may end the journey itself (its key revoked, a shutdown's time up:
:mod:`edge.inflight`); it then fails with that reason, as a stage's error would. A new concern is a new
stage, added with :meth:`Pipeline.with_stage`, without touching the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import cast

from aiohttp import web

from edge.journey import Journey, Racing, Reply
from edge.stream_reply import StreamReply, failed_before_first_byte
from nearshore.protocol.errors import INTERNAL, ApiError

log = logging.getLogger("nearshore.edge")

Step = Callable[[Journey], Awaitable[Reply | Racing | None]]
# A stage that races: it gets the racing reply an earlier stage returned (None when none did).
RacingStep = Callable[[Journey, Racing | None], Awaitable[Reply | None]]


# A closing stage: run at the journey's exit, whatever ended it.
ClosingStep = Callable[[Journey], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    run: Step | RacingStep | ClosingStep
    races: bool = False  # run(journey, racing): it asks the region, racing an earlier stage's reply
    closes: bool = False  # run at the exit, after the stage that answered (or failed), in order
    best_effort: bool = False  # (closing) its failure is logged, never stands between a request and its bill


class Pipeline:
    def __init__(self, stages: Sequence[Stage]) -> None:
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique: {names}")
        self.stages = tuple(s for s in stages if not s.closes)
        self.closing = tuple(s for s in stages if s.closes)

    @property
    def names(self) -> list[str]:
        return [s.name for s in (*self.stages, *self.closing)]

    def with_stage(self, stage: Stage, *, before: str) -> Pipeline:
        """A pipeline with ``stage`` inserted before the stage named ``before``."""
        every = [*self.stages, *self.closing]
        at = self.names.index(before)
        return Pipeline([*every[:at], stage, *every[at:]])

    def without(self, name: str) -> Pipeline:
        return Pipeline([s for s in (*self.stages, *self.closing) if s.name != name])


async def run_journey(pipeline: Pipeline, journey: Journey) -> web.StreamResponse:
    state = journey.state
    try:
        reply = await _run_stoppable(pipeline, journey)
    except asyncio.CancelledError:
        # The client left. Its row is written although this task is being cancelled.
        if not journey.outcome.recorded:
            journey.left()
        await _clean_up(journey)
        state.in_background(_close(pipeline, journey))
        raise
    except ApiError as exc:
        if not journey.outcome.recorded:
            journey.failed(exc)
        await _clean_up(journey)
        await _close(pipeline, journey)
        raise
    except Exception:
        if not journey.outcome.recorded:
            journey.failed(ApiError(INTERNAL, "internal error"))
        await _clean_up(journey)
        await _close(pipeline, journey)
        raise
    await _clean_up(journey)
    # The one exit: the ledger row is committed before the answer's end, so a client that saw it was billed.
    await _close(pipeline, journey)
    return await reply.finish(journey.settled)


async def _run_stoppable(pipeline: Pipeline, journey: Journey) -> Reply:
    """The stages, which the edge may end itself (edge/inflight.py: the key revoked, a shutdown's time up):
    then the request fails with that reason, and a stream already begun ends with its error event."""
    with journey.state.inflight.running(journey) as running:
        try:
            return await _run_stages(pipeline, journey)
        except asyncio.CancelledError:
            if not running.took_stop():
                raise  # the client left
            assert running.stopped is not None
            log.info("request %s: ended by the edge (%s)", journey.request_id, running.stopped.kind.code)
            journey.outcome.stopped = True
            stream = journey.forwarded.stream
            return failed_before_first_byte(
                journey, stream if isinstance(stream, StreamReply) else None, running.stopped
            )


async def _run_stages(pipeline: Pipeline, journey: Journey) -> Reply:
    """The stages in order, up to the first that answers; a racing reply goes to the next stage that races."""
    racing: Racing | None = None
    for stage in pipeline.stages:
        if stage.races:
            result = await cast(RacingStep, stage.run)(journey, racing)
            racing = None
        else:
            result = await cast(Step, stage.run)(journey)
        if isinstance(result, Racing):
            racing = result
        elif result is not None:
            return result
    raise RuntimeError(f"no stage answered ({pipeline.names})")


async def _close(pipeline: Pipeline, journey: Journey) -> None:
    """The closing stages, in order."""
    for stage in pipeline.closing:
        try:
            await cast(ClosingStep, stage.run)(journey)
        except Exception:
            if not stage.best_effort:
                raise
            log.exception("the %s stage failed for request %s", stage.name, journey.request_id)


async def _clean_up(journey: Journey) -> None:
    cleanups, journey.cleanups = journey.cleanups, []
    for cleanup in reversed(cleanups):
        try:
            await cleanup()
        except Exception:  # a cleanup must never stand between a request and its bill
            log.exception("cleanup failed for request %s", journey.request_id)
