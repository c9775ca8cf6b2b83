"""Per-key spending budgets, held like TPM reservations: the worst case up front, the real cost at the end.

A request on a budgeted key holds its worst-case cost (every prompt token at the input price, every
``max_tokens`` token at the output price) until it settles; a request is admitted only if what the key has
spent plus everything held plus its own worst case stays within the budget. So many requests at once can never
overspend it together, as they could when only the spend so far was checked.

What a key has spent is read from the ledger once per process, then kept up to date as requests settle. Keys
shared by several edge processes are held per process (each checks against the ledger it was started with).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from edge.keys import ApiKey
from nearshore.protocol.errors import EXCEEDS_LIMIT, QUOTA_EXCEEDED, ApiError


@dataclass(frozen=True, slots=True)
class Hold:
    key_id: str
    usd: float


class BudgetBook:
    def __init__(self, spent_of: Callable[[str], float]) -> None:
        self._spent_of = spent_of  # blocking: a ledger query, run in a thread
        self.spent: dict[str, float] = {}
        self.held: dict[str, float] = {}
        self._loading: dict[str, asyncio.Future[float]] = {}

    async def hold(self, key: ApiKey, worst_usd: float) -> Hold | None:
        """Hold ``worst_usd`` against the key's budget, or raise the OpenAI-shaped refusal."""
        budget = key.budget_usd
        if budget is None:
            return None
        if key.key_id not in self.spent:
            await self._load(key.key_id)
        # From here to the end nothing awaits: the check and the hold are one step for this event loop.
        spent = self.spent[key.key_id]
        held = self.held.get(key.key_id, 0.0)
        if spent >= budget:
            raise ApiError(QUOTA_EXCEEDED, f"This key has used its budget (${spent:.6f} of ${budget:.6f}).")
        if worst_usd > budget:
            raise ApiError(
                EXCEEDS_LIMIT,
                f"This request could cost up to ${worst_usd:.6f}, more than this key's whole budget of "
                f"${budget:.6f}: lower max_tokens or shorten the prompt.",
                param="max_tokens",
            )
        if spent + held + worst_usd > budget:
            raise ApiError(
                QUOTA_EXCEEDED,
                f"This request could cost up to ${worst_usd:.6f}; this key has ${budget - spent - held:.6f} "
                "of its budget left after the requests in flight.",
                retry_after_s=1,
            )
        self.held[key.key_id] = held + worst_usd
        return Hold(key.key_id, worst_usd)

    async def _load(self, key_id: str) -> None:
        """Read the key's spend once, however many of its requests arrive while it is being read."""
        loading = self._loading.get(key_id)
        if loading is None:
            loading = asyncio.ensure_future(asyncio.to_thread(self._spent_of, key_id))
            self._loading[key_id] = loading
            loading.add_done_callback(lambda _done: self._loading.pop(key_id, None))
        spent = await asyncio.shield(loading)
        self.spent.setdefault(key_id, spent)

    def settle(self, hold: Hold | None, key_id: str, cost_usd: float) -> None:
        """Release the hold (if any) and add the real cost to what the key has spent."""
        if hold is not None:
            left = self.held.get(hold.key_id, 0.0) - hold.usd
            if left > 1e-12:
                self.held[hold.key_id] = left
            else:
                self.held.pop(hold.key_id, None)
        if key_id in self.spent:
            self.spent[key_id] += cost_usd
