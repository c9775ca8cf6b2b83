"""Output safety filters: decide where generated text must be cut (finish_reason "content_filter").

A filter answers two questions about the text generated so far: where the first violation at or after
``start`` begins, and how many trailing characters must be held back because they may be the start of
one. The default is a case-insensitive blocklist; ``safety.hook = "module:callable"`` plugs in another.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class SafetyFilter(Protocol):
    def find(self, text: str, start: int) -> int | None:
        """Index of the first violation that begins at or after ``start``, or None."""
        ...

    def holdback(self, text: str) -> int:
        """How many trailing characters of ``text`` could begin a violation not yet complete."""
        ...


class BlocklistFilter:
    """Blocks any of the given phrases, case-insensitively, even when split across tokens."""

    def __init__(self, phrases: Sequence[str]) -> None:
        self.phrases = sorted({p.lower() for p in phrases if p}, key=len, reverse=True)

    def find(self, text: str, start: int) -> int | None:
        lowered = text.lower()
        hits = [i for p in self.phrases if (i := lowered.find(p, start)) >= 0]
        return min(hits) if hits else None

    def holdback(self, text: str) -> int:
        return longest_partial_suffix(text.lower(), self.phrases)


class CallableFilter:
    """Wraps ``fn(text) -> bool``: True blocks all the text not yet sent."""

    def __init__(self, fn: Callable[[str], bool]) -> None:
        self.fn = fn

    def find(self, text: str, start: int) -> int | None:
        return start if self.fn(text) else None

    def holdback(self, text: str) -> int:
        return 0


class AnyFilter:
    """Several filters as one: the earliest violation, the longest hold."""

    def __init__(self, filters: Sequence[SafetyFilter]) -> None:
        self.filters = list(filters)

    def find(self, text: str, start: int) -> int | None:
        hits = [i for f in self.filters if (i := f.find(text, start)) is not None]
        return min(hits) if hits else None

    def holdback(self, text: str) -> int:
        return max((f.holdback(text) for f in self.filters), default=0)


def longest_partial_suffix(text: str, needles: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``needles``."""
    best = 0
    for needle in needles:
        for k in range(min(len(needle) - 1, len(text)), best, -1):
            if text.endswith(needle[:k]):
                best = k
                break
    return best


def load_hook(spec: str) -> SafetyFilter:
    """Import ``module:attr``; attr is a filter, a factory of one, or a ``fn(text) -> bool``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"safety.hook must look like 'module:callable', got {spec!r}")
    target = getattr(importlib.import_module(module_name), attr)
    if isinstance(target, SafetyFilter):
        return target
    if isinstance(target, type):
        made = target()
        if isinstance(made, SafetyFilter):
            return made
        raise ValueError(f"safety.hook {spec!r}: {target.__name__}() is not a safety filter")
    if callable(target):
        return CallableFilter(target)
    raise ValueError(f"safety.hook {spec!r} is neither a filter nor a callable")


def build_filter(blocklist: Sequence[str], hook: str) -> SafetyFilter | None:
    filters: list[SafetyFilter] = []
    if blocklist:
        filters.append(BlocklistFilter(blocklist))
    if hook:
        filters.append(load_hook(hook))
    if not filters:
        return None
    return filters[0] if len(filters) == 1 else AnyFilter(filters)
