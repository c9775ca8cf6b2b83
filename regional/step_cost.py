"""What a step costs on this node, measured: the prompt-token budget of a step kept short for a newcomer.

A step cannot be cut short once it runs, so a newcomer waits for the one in progress before its own begins.
While keys share the node the scheduler keeps every step to about ``shared_step_ms``: how many prompt tokens
that buys depends on the hardware (a CPU pays tens of ms a step whatever it holds, then ms a token; a GPU a
few ms and microseconds a token), so it is fitted here, not configured.

The model is ``ms = fixed + per_token * tokens + per_scored_row * scored_rows`` (a scored row is a prompt
row whose whole vocabulary row is computed and scored: log-probabilities), fitted by least squares over the
last ``WINDOW`` steps, refitted every ``REFIT_EVERY``. Until the fit is meaningful (steps of enough sizes,
a positive per-token cost) there is no budget: the configured ``prefill_chunk`` holds.
"""

from __future__ import annotations

from collections import deque

import numpy as np

WINDOW = 256
REFIT_EVERY = 16
MIN_STEPS = 32
# Distinct step sizes the fit needs before its per-token slope means anything.
MIN_SIZES = 4


class StepCost:
    def __init__(self, target_ms: float, prior: tuple[float, float] | None = None) -> None:
        """``prior``: (fixed, per token) ms from the warm-up's steps (:meth:`two_point`), for the prefill
        cost the node reports until its own fit (not for the budget: two steps are no fit)."""
        self.target_ms = target_ms
        self.prior = prior
        self._steps: deque[tuple[int, int, float]] = deque(maxlen=WINDOW)
        self._since_fit = 0
        # ms: the fixed part, per prompt token, per scored row (None: not fitted yet).
        self.fit: tuple[float, float, float] | None = None

    def observe(self, tokens: int, scored_rows: int, seconds: float) -> None:
        """One step ran: ``tokens`` batch rows, ``scored_rows`` of them scored, in ``seconds``."""
        self._steps.append((tokens, scored_rows, seconds * 1000.0))
        self._since_fit += 1
        if self._since_fit >= REFIT_EVERY:
            self._since_fit = 0
            self.fit = _fit(self._steps)

    def prompt_budget(self, decode_tokens: int, floor: int, ceiling: int) -> tuple[int, int]:
        """(prompt tokens, scored rows) a step holding ``decode_tokens`` decodes may add within the target:
        at least ``floor`` tokens (everyone's prompt must advance) and at most ``ceiling``; the rows are
        counted within the tokens. Without a fit: ``ceiling`` for both."""
        if self.target_ms <= 0 or self.fit is None:
            return ceiling, ceiling
        fixed, per_token, per_row = self.fit
        left_ms = self.target_ms - fixed - per_token * decode_tokens
        tokens = int(left_ms / per_token) if left_ms > 0 else 0
        tokens = max(floor, min(ceiling, tokens))
        rows = int(left_ms / (per_token + per_row)) if left_ms > 0 and per_row > 0 else tokens
        return tokens, max(1, min(tokens, rows))

    def prefill_ms_per_token(self, chunk: int) -> float:
        """What a prompt token costs its prefill, in ms, for a prompt taken ``chunk`` tokens a step (each
        step's fixed part shared by its tokens); until fitted, by the prior; 0 without either. The node's
        load report carries it: what the edge's router takes a long prompt's prefill there to cost."""
        fixed, per_token = self.fit[:2] if self.fit is not None else self.prior or (0.0, 0.0)
        return per_token + fixed / max(chunk, 1) if per_token > 0 else 0.0

    def two_point(self) -> tuple[float, float] | None:
        """(fixed, per token) ms through the latest one-row step and the largest after it (the warm-up's
        decode and its measured prefill); None without both, or for a slope that is no cost."""
        steps = list(self._steps)
        last_single = max((i for i, step in enumerate(steps) if step[0] == 1), default=-1)
        after = steps[last_single + 1 :] if last_single >= 0 else []
        largest = max(after, key=lambda step: step[0], default=None)
        if largest is None or largest[0] <= 1:
            return None
        single_ms = steps[last_single][2]
        per_token = (largest[2] - single_ms) / (largest[0] - 1)
        return (max(single_ms - per_token, 0.0), per_token) if per_token > 0 else None


def _fit(steps: deque[tuple[int, int, float]]) -> tuple[float, float, float] | None:
    if len(steps) < MIN_STEPS or len({tokens for tokens, _, _ in steps}) < MIN_SIZES:
        return None
    data = np.asarray(steps, dtype=np.float64)
    tokens, rows, ms = data[:, 0], data[:, 1], data[:, 2]
    columns = [np.ones_like(tokens), tokens]
    scored = bool(rows.any()) and len(set(rows.tolist())) > 1
    if scored:
        columns.append(rows)
    solution = np.linalg.lstsq(np.stack(columns, axis=1), ms, rcond=None)[0]
    fixed, per_token = float(solution[0]), float(solution[1])
    per_row = float(solution[2]) if scored else 0.0
    if per_token <= 0:
        return None  # noise, not a cost: no budget rather than a wrong one
    return max(fixed, 0.0), per_token, max(per_row, 0.0)
