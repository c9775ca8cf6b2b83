"""Right-sizing: a model alias (say ``auto``) that picks the small or the large pool's model by what the
request needs. A small model answers classification, extraction and short answers faster and cheaper; a
long prompt, a long answer, a tier that pays for the large model, or an explicit hint sends it to the large.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

Hint = Literal["small", "large", ""]


class SizeAlias(Struct, forbid_unknown_fields=True, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=64)]
    small: str  # a model the edge serves (from the small pool)
    large: str  # a model the edge serves (from the large pool)
    # The small model takes a request whose prompt and answer both fit these.
    small_max_prompt_tokens: Annotated[int, Meta(ge=0)] = 1024
    small_max_tokens: Annotated[int, Meta(ge=0)] = 256
    # Keys of these tiers always get the large model.
    large_tiers: list[str] = field(default_factory=list)


def choose(alias: SizeAlias, prompt_tokens: int, max_tokens: int, tier: str, hint: str) -> tuple[str, str]:
    """The model for this request and why, in a few words."""
    if hint in ("small", "large"):
        return getattr(alias, hint), f"hint={hint}"
    if tier in alias.large_tiers:
        return alias.large, f"tier={tier}"
    if prompt_tokens > alias.small_max_prompt_tokens:
        return alias.large, f"prompt={prompt_tokens}>{alias.small_max_prompt_tokens}"
    if max_tokens > alias.small_max_tokens:
        return alias.large, f"max_tokens={max_tokens}>{alias.small_max_tokens}"
    return alias.small, "fits the small model"


def check_aliases(aliases: list[SizeAlias], models: list[str]) -> list[str]:
    problems = []
    seen: set[str] = set()
    for i, a in enumerate(aliases):
        key = f"aliases[{i}] ({a.name})"
        if a.name in seen:
            problems.append(f"{key}: the name {a.name!r} is used twice")
        seen.add(a.name)
        if a.name in models:
            problems.append(f"{key}: {a.name!r} is also a model's name")
        for size in ("small", "large"):
            if getattr(a, size) not in models:
                problems.append(f"{key}.{size}: {getattr(a, size)!r} is not in the edge's models")
    return problems
