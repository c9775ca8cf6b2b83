"""Prices per model and the cost of one request (see ARCHITECTURE.md, the settle step)."""

from __future__ import annotations

import msgspec

# Not negative (checked with the config's other values, edge/config.py's value_problems, where the error can
# name the model: a constraint here would be reported as "prices[...]").
UsdPerMillion = float


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """USD per million tokens: fresh prompt tokens, prompt tokens served from a cache, completion tokens.

    A model served at no charge says so with ``free = true``; otherwise ``input`` and ``output`` are required
    (``cached_input`` defaults to ``input``), so a forgotten price is a config error, never a free model.
    """

    input: UsdPerMillion | None = None
    cached_input: UsdPerMillion | None = None
    output: UsdPerMillion | None = None
    free: bool = False

    def problem(self) -> str | None:
        """Why this entry is not a usable price, or None."""
        given = [v for v in (self.input, self.cached_input, self.output) if v]
        if self.free:
            return "free = true cannot be combined with non-zero prices" if given else None
        if self.input is None or self.output is None:
            return "needs input and output (USD per million tokens), or free = true"
        return None


REGION_SEP = "@"  # prices."<model>@<region>": the model's price where that region (a provider) serves it


class PriceTable:
    """Model name -> price, and "<model>@<region>" -> the model's price in that region (a provider's own,
    say). Every served name has an entry (the edge's config check makes sure)."""

    def __init__(self, prices: dict[str, Price]) -> None:
        self.prices = dict(prices)
        self._by_model: dict[str, list[Price]] = {}
        for name, price in self.prices.items():
            self._by_model.setdefault(name.split(REGION_SEP, 1)[0], []).append(price)

    def price(self, model: str, region: str = "") -> Price | None:
        """What ``model`` costs where ``region`` serves it: the region's own price, else the model's."""
        own = self.prices.get(f"{model}{REGION_SEP}{region}") if region else None
        return own if own is not None else self.prices.get(model)

    def cost(
        self, model: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int, region: str = ""
    ) -> float:
        """USD for one request served in ``region``. ``cached_tokens`` is the part of ``prompt_tokens`` that
        hit a cache."""
        return _cost(self.price(model, region), prompt_tokens, cached_tokens, completion_tokens)

    def worst_case(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        """The most a request can cost: every prompt token fresh, every completion token produced, in the
        dearest region that serves the model (it is held before a region is chosen)."""
        prices = self._by_model.get(model) or [None]
        return max(_cost(p, prompt_tokens, 0, completion_tokens) for p in prices)


def _cost(price: Price | None, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
    if price is None or price.free:
        return 0.0
    input_usd = price.input or 0.0
    cached_usd = input_usd if price.cached_input is None else price.cached_input
    # Clamp, so an inconsistent usage report can never make a request cost less than nothing.
    cached = min(max(cached_tokens, 0), max(prompt_tokens, 0))
    fresh = max(prompt_tokens, 0) - cached
    completion = max(completion_tokens, 0)
    return (fresh * input_usd + cached * cached_usd + completion * (price.output or 0.0)) / 1e6
