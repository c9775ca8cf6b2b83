"""A step's grammar work, beside the model: the masks of the constrained sequences a step samples are
computed on a thread of their own while the model runs (llguidance drops the GIL, as llama.cpp's decode
and torch's kernels do), so the sampler finds them ready; then each grammar takes the token drawn.

The mask of a sequence's next token depends only on the tokens it has drawn, all known when the step
begins, so computing it during the step's forward pass is exact. What the grammars cost is counted here
for ``/metrics`` (``grammar_seconds``, ``grammar_tokens``): the share of the step a grammar takes.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from regional.grammar import Constraint, GrammarError, LazyConstraint, Vocabulary
from regional.sequence import Sequence
from regional.step_plan import StepPlan

log = logging.getLogger("nearshore.engine")


def checked(vocab: Vocabulary, grammar: str, trigger: str | None) -> Constraint | LazyConstraint:
    """A sequence's matcher of a checked grammar, with its first mask computed: a grammar that allows no
    output at all (a ``$ref`` loop, bounds no value meets), or whose forced output never ends (a required
    ``$ref`` back into itself), raises :class:`GrammarError` here, before the sequence is queued (off the
    event loop: a large grammar takes milliseconds)."""
    constraint = vocab.constraint(grammar, trigger)
    constraint.check()
    return constraint


def _prepare(constraints: list[Constraint | LazyConstraint]) -> float:
    started = time.perf_counter()
    for constraint in constraints:
        constraint.prepare()  # a grammar that allows nothing raises later, where its sequence samples
    return time.perf_counter() - started


class GrammarStep:
    """The grammar thread and the grammars' running cost. Owned by the engine's worker thread."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None  # made on the first constrained step
        self.seconds = 0.0  # computing masks and advancing grammars
        self.tokens = 0  # tokens drawn under a grammar

    def begin(self, plan: StepPlan) -> Future[float] | None:
        """Start the masks of the step's constrained samples; call before the model runs."""
        constraints = [seq.constraint for seq, _row in plan.samples if seq.constraint is not None]
        if not constraints:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        return self._pool.submit(_prepare, constraints)

    def ready(self, pending: Future[float] | None) -> None:
        """Wait for the masks begun for this step (the model has run); the sampler reads them."""
        if pending is not None:
            self.seconds += pending.result()

    def advance(self, plan: StepPlan, sampled: list[int | None], failures: dict[Sequence, str]) -> None:
        """Each constrained sequence's grammar takes the token it drew; one that refuses it (never, with the
        mask applied) fails that sequence alone."""
        if all(seq.constraint is None for seq, _row in plan.samples):
            return
        started = time.perf_counter()
        for i, ((seq, _row), token) in enumerate(zip(plan.samples, sampled, strict=True)):
            if token is None or seq.constraint is None:
                continue
            masked = not isinstance(seq.constraint, LazyConstraint) or seq.constraint.state == "triggered"
            try:
                seq.constraint.advance(token)
                self.tokens += masked
            except GrammarError as exc:  # the request's own error (a 400), not the engine's
                log.warning("request %s: %s", seq.request_id, exc)
                sampled[i] = None
                failures[seq] = str(exc)
        self.seconds += time.perf_counter() - started

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
