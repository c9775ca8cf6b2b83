"""What the response cache needs to know about one request, below the stages that use it: the client's
``Cache-Control`` directives, whose entries it may be answered from (its scope), and its semantic lookup,
started by the forward stage (raced against the region) and reused by the store stage (its embedding).

Policy (README, "The response cache"): ``no-cache`` skips the lookup and its fresh answer replaces the
stored one, ``no-store`` skips the write, ``max-age=N`` accepts only entries younger than N seconds and keeps
a new one at most N seconds. A shared tenant's keys share every entry; otherwise ``cache.scope`` says whose
entries a request may see: the tenant's, the key's, or the key's end user's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from cache.keys import CacheKey
from cache.response_cache import Lookup, ResponseCache
from cache.store import Entry
from edge.cache_audit import Audited
from edge.keys import ApiKey

SHARED_SCOPE = "shared"


@dataclass(frozen=True, slots=True)
class Directives:
    read: bool = True
    write: bool = True
    max_age_s: float | None = None

    def fresh(self, entry: Entry) -> bool:
        return self.max_age_s is None or time.time() - entry.created_s <= self.max_age_s


NO_DIRECTIVES = Directives()


def cache_control(header: str) -> Directives:
    """The request's ``Cache-Control`` as the cache obeys it (unknown directives are ignored)."""
    read = write = True
    max_age: float | None = None
    for part in header.lower().split(","):
        name, _, value = part.strip().partition("=")
        if name == "no-cache":
            read = False
        elif name == "no-store":
            write = False
        elif name == "max-age":
            try:
                max_age = max(0.0, float(value.strip().strip('"')))
            except ValueError:
                continue
    return Directives(read, write, max_age)


def scope_of(scope: str, shared: bool, key: ApiKey, user: str | None) -> str:
    """Whose entries a request may be answered from (``cache.scope``; a shared tenant shares them all)."""
    if shared:
        return SHARED_SCOPE
    if scope == "key" or (scope == "user" and not user):
        return f"key:{key.key_id}"
    if scope == "user":
        return f"user:{key.key_id}:{user}"
    return f"tenant:{key.tenant}"


class SemanticLookup:
    """One request's semantic lookup: started once the region's request is on its way (``start``), or
    never (the journey ended before it asked a region). What only the lookup, the store and the audit need
    (``audited``: the question's partition, kind and the regions it may be embedded in) is worked out when
    first needed, after the region's request has gone."""

    def __init__(
        self, cache: ResponseCache, key: CacheKey, started: float, audited_of: Callable[[], Audited]
    ) -> None:
        self.cache, self.key = cache, key
        self.started = started  # (perf_counter) the lookup's time counts from the exact lookup
        self.task: asyncio.Task[Lookup] | None = None
        self._audited_of = audited_of
        self._audited: Audited | None = None

    @property
    def audited(self) -> Audited:
        if self._audited is None:
            self._audited = self._audited_of()
        return self._audited

    def start(self) -> asyncio.Task[Lookup]:
        assert self.task is None, "a request's semantic lookup starts once"
        self.task = asyncio.create_task(self.cache.semantic(self.key, self.audited.regions))
        return self.task

    def drop(self) -> None:
        """Nothing will be stored: a lookup still running is not needed."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
