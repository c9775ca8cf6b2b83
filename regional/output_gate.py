"""Releases generated text to the client only once no stop sequence or blocked phrase can still begin in it.

Text that might be the start of a stop string (or of a blocked phrase) is held back until the next
token settles it, so no part of a stop string is ever sent, whatever the token boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from regional.safety import SafetyFilter, longest_partial_suffix

GateFinish = Literal["stop", "content_filter"]


class OutputGate:
    def __init__(self, stops: Sequence[str] = (), safety: SafetyFilter | None = None) -> None:
        self.stops = [s for s in stops if s]
        self.safety = safety
        self.text = ""
        self.released = 0

    def feed(self, delta: str) -> tuple[str, GateFinish | None]:
        """Add a token's text; return what may be sent now and, if the output must end, why."""
        self.text += delta
        stop_at = self._first_stop()
        blocked_at = self.safety.find(self.text, self.released) if self.safety else None
        if stop_at is not None or blocked_at is not None:
            if blocked_at is not None and (stop_at is None or blocked_at < stop_at):
                return self._release_until(blocked_at), "content_filter"
            assert stop_at is not None
            return self._release_until(stop_at), "stop"
        hold = longest_partial_suffix(self.text[self.released :], self.stops)
        if self.safety is not None:
            hold = max(hold, self.safety.holdback(self.text[self.released :]))
        return self._release_until(len(self.text) - hold), None

    def flush(self) -> str:
        """The generation ended for another reason: whatever is held back is plain output."""
        return self._release_until(len(self.text))

    def _first_stop(self) -> int | None:
        hits = [i for s in self.stops if (i := self.text.find(s, self.released)) >= 0]
        return min(hits) if hits else None

    def _release_until(self, end: int) -> str:
        end = max(end, self.released)
        out = self.text[self.released : end]
        self.released = end
        return out

    @property
    def output(self) -> str:
        """Everything released so far."""
        return self.text[: self.released]
