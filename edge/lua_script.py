"""A Lua script for Redis, named by its SHA-1 as EVALSHA wants it. Apart from the runner
(edge/redis_scripts.py) so that a module declaring its scripts does not import redis-py: an edge without
Redis never loads it (0.1 s of every start)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Script:
    source: str
    sha: str
    watches_resets: bool = False  # the limiter's admission: a Redis that lost it may have lost its data

    @classmethod
    def of(cls, source: str, watches_resets: bool = False) -> Script:
        return cls(source, hashlib.sha1(source.encode()).hexdigest(), watches_resets)
