"""What one hostile instance remembers, all of it bounded: the request log, the control override, and
the first sighting of keyed faults (``500-once``'s tags, ``down``'s windows).

``GET /_log`` answers :meth:`RequestLog.to_json`; ``POST /_control`` sets an :class:`Override`. Times in
the log are ``time.time()`` so two instances' logs can be compared; windows use ``time.monotonic()``.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.standins.hostile_spec import Spec

MAX_LOGGED = 1000
MAX_REMEMBERED = 10_000


@dataclass
class Record:
    """One request as the instance received and answered it; status and end are filled in as they happen."""

    t: float  # arrival (time.time(), request fully read)
    method: str
    path: str
    request_id: str | None
    mode: str | None = None  # the choice, e.g. "stall-at:3:1"; None on routes without modes
    source: str | None = None  # where the choice came from: request, control, flag or fallback
    status: int | None = None  # the status line sent; None while nothing was sent (hang, reset)
    end_t: float | None = None  # when the answer ended (or the connection did); None while running


@dataclass
class RequestLog:
    records: deque[Record] = field(default_factory=lambda: deque(maxlen=MAX_LOGGED))

    def add(self, record: Record) -> Record:
        self.records.append(record)
        return record

    def clear(self) -> int:
        dropped = len(self.records)
        self.records.clear()
        return dropped

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(record) for record in self.records]


@dataclass(frozen=True)
class Override:
    """A default mode set through ``POST /_control`` until ``until`` (monotonic), then ``--mode`` again."""

    spec: Spec
    until: float

    @property
    def active(self) -> bool:
        return time.monotonic() < self.until


class Memory:
    """When each key was first seen, for the newest ``max_keys`` keys (the oldest is forgotten first)."""

    def __init__(self, max_keys: int = MAX_REMEMBERED) -> None:
        self.max_keys = max_keys
        self._first_seen: OrderedDict[tuple[Any, ...], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._first_seen)

    def first_seen(self, key: tuple[Any, ...]) -> tuple[float, bool]:
        """When ``key`` was first seen (monotonic), and whether that is now."""
        if key in self._first_seen:
            self._first_seen.move_to_end(key)
            return self._first_seen[key], False
        return self.restart(key), True

    def restart(self, key: tuple[Any, ...]) -> float:
        """Count ``key`` as first seen now (``POST /_control`` re-arms a fault this way)."""
        self._first_seen.pop(key, None)
        self._first_seen[key] = now = time.monotonic()
        while len(self._first_seen) > self.max_keys:
            self._first_seen.popitem(last=False)
        return now

    def forget(self, key: tuple[Any, ...]) -> None:
        self._first_seen.pop(key, None)
