"""The requests in flight, which the edge may end itself: those of a key revoked meanwhile, and those still
running when a shutdown's time is up.

Each journey's stages run registered here (:func:`edge.pipeline.run_journey`). Ending one cancels its task
with a reason; the pipeline takes that cancellation back (it is the edge's, not the client's leaving), and
the request ends as a failure with that reason: a stream gets an error event and ``[DONE]``, an answer not
begun gets the plain error, the region's request is cancelled as when a client leaves, and the ledger row
bills what was delivered, with the reason's status and code. A client that leaves at the same moment wins:
its request ends as left (499), as it would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from edge.keys import ApiKey, KnownKeys
from nearshore.protocol.errors import KEY_REVOKED, SERVER_SHUTTING_DOWN, ApiError

log = logging.getLogger("nearshore.edge")


class Journey(Protocol):
    """What this module reads of a journey (edge/journey.py, which sits above it: the state holds these)."""

    @property
    def key(self) -> ApiKey | None: ...


# Once the edge has ended its requests, how long they get to send their last event and write their rows.
STOP_GRACE_S = 1.0


@dataclass(slots=True, eq=False)
class Running:
    """One journey while its stages run; ``stopped``: why the edge ended it (None: it did not)."""

    journey: Journey
    task: asyncio.Task
    stopped: ApiError | None = None

    def stop(self, error: ApiError) -> None:
        if self.stopped is None and not self.task.done():
            self.stopped = error
            self.task.cancel(error.message)

    def took_stop(self) -> bool:
        """Whether the cancellation being handled is only the edge's stop (then it is taken back, and the
        request goes on to its end); False when the client left too, or the edge never stopped it."""
        return self.stopped is not None and self.task.uncancel() == 0


class InFlight:
    """The journeys whose stages are running, in one process."""

    def __init__(self) -> None:
        self._running: set[Running] = set()
        self._emptied: asyncio.Event | None = None  # set when the last one ends, while someone waits

    def __len__(self) -> int:
        return len(self._running)

    @contextlib.contextmanager
    def running(self, journey: Journey) -> Iterator[Running]:
        """Register ``journey`` (run inside its own task) for as long as the block runs."""
        task = asyncio.current_task()
        assert task is not None
        entry = Running(journey, task)
        self._running.add(entry)
        try:
            yield entry
        finally:
            self._running.discard(entry)
            if not self._running and self._emptied is not None:
                self._emptied.set()

    def stop(self, error: Callable[[], ApiError], which: Callable[[Journey], bool] = lambda _: True) -> int:
        """End the journeys ``which`` selects, each with its own ``error()``; how many were ended."""
        chosen = [r for r in self._running if r.stopped is None and which(r.journey)]
        for entry in chosen:
            entry.stop(error())
        return len(chosen)

    async def emptied(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every journey to end; whether they all did."""
        if not self._running:
            return True
        self._emptied = self._emptied or asyncio.Event()
        self._emptied.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self._emptied.wait()
        except TimeoutError:
            return False
        return True


def key_revoked() -> ApiError:
    return ApiError(
        KEY_REVOKED, "This API key was revoked while the request was in flight: the answer ends here."
    )


def shutting_down() -> ApiError:
    return ApiError(
        SERVER_SHUTTING_DOWN,
        "The edge is shutting down and this request was still in flight: the answer ends here; ask again.",
        retry_after_s=1,
    )


def end_revoked(inflight: InFlight, keys: KnownKeys) -> int:
    """End the requests whose key is no longer active in ``keys``' copy (revoked or deleted since they
    started); called after each reload of the copy."""

    gone: set[str] = set()

    def revoked(journey: Journey) -> bool:
        if journey.key is None or keys.active(journey.key.key_id):
            return False
        gone.add(journey.key.key_id)
        return True

    ended = inflight.stop(key_revoked, revoked)
    if ended:
        log.warning("ended %d request(s) in flight of revoked key(s) %s", ended, ", ".join(sorted(gone)))
    return ended


async def drain(inflight: InFlight, timeout_s: float) -> None:
    """The shutdown's wait: the requests in flight get ``timeout_s`` to end on their own; those still running
    then are ended (the client is told, the row written) within :data:`STOP_GRACE_S`."""
    if not inflight:
        return
    log.info("shutting down: %d request(s) in flight get up to %gs to finish", len(inflight), timeout_s)
    if await inflight.emptied(timeout_s):
        return
    ended = inflight.stop(shutting_down)
    log.warning("shutting down: ended %d request(s) still in flight after %gs", ended, timeout_s)
    if not await inflight.emptied(STOP_GRACE_S):
        log.warning("shutting down: %d request(s) did not end in time", len(inflight))
