"""Prices per model and the cost of one request (DESIGN.md, step 7)."""

from __future__ import annotations

from typing import Annotated

import msgspec

UsdPerMillion = Annotated[float, msgspec.Meta(ge=0)]


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """USD per million tokens: fresh prompt tokens, prompt tokens served from a cache, completion tokens."""

    input: UsdPerMillion
    cached_input: UsdPerMillion
    output: UsdPerMillion


class PriceTable:
    """Model name -> price. A model with no price of its own uses ``default``; with no default it costs 0.0:
    an unpriced (e.g. local, free) model is served and metered in tokens, never refused for want of a price.
    """

    def __init__(self, prices: dict[str, Price], default: Price | None = None) -> None:
        self.prices = dict(prices)
        self.default = default

    def price(self, model: str) -> Price | None:
        return self.prices.get(model, self.default)

    def cost(self, model: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
        """USD for one request. ``cached_tokens`` is the part of ``prompt_tokens`` that hit a cache."""
        price = self.price(model)
        if price is None:
            return 0.0
        # Clamp, so an inconsistent usage report can never make a request cost less than nothing.
        cached = min(max(cached_tokens, 0), max(prompt_tokens, 0))
        fresh = max(prompt_tokens, 0) - cached
        completion = max(completion_tokens, 0)
        return (fresh * price.input + cached * price.cached_input + completion * price.output) / 1e6
