"""What one step gave: the model's logits (:class:`StepLogits`), the sampled tokens (:class:`StepOutput`),
and the events they make for the requests.

The engine's ``_run_model`` returns the logits its ``_sample`` takes, so nothing of a step outlives it on
the engine; the step's output goes to the scheduler's ``postprocess`` and, as events, to the requests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from regional.engine import Logprobs, TokenEvent
from regional.sequence import Sequence
from regional.step_plan import StepPlan

log = logging.getLogger("nearshore.engine")
Events = list[tuple[Sequence, TokenEvent]]


class StepLogits(Protocol):
    """The logits one model call gave, for the batch rows whose ``want_logits`` was set."""

    def row(self, batch_row: int) -> np.ndarray:
        """The logits of batch row ``batch_row`` (float32, read-only)."""
        ...


class Vocabulary(Protocol):
    def token_bytes(self, token: int) -> bytes: ...

    def is_end_of_generation(self, token: int) -> bool: ...


@dataclass(slots=True)
class StepOutput:
    """What running a plan gave: nothing (nobody ran), no room in the model, or a token per sample."""

    ran: bool = False  # the model ran the batch
    model_full: bool = False  # the model had no room for the batch and ran none of it
    started: float = 0.0  # when the model call began (perf_counter)
    sampled: list[int | None] = field(default_factory=list)  # follows plan.samples; None: sampling failed
    logprobs: list[Logprobs | None] = field(default_factory=list)  # follows plan.samples
    failures: dict[Sequence, str] = field(default_factory=dict)  # why a sampling failed
    prompt_scores: list[list[Logprobs]] = field(default_factory=list)  # follows plan.prompt_rows


def step_events(plan: StepPlan, output: StepOutput, vocab: Vocabulary, now: float) -> Events:
    """The events of a step the scheduler has taken in: the finishes of those that could never fit, then,
    when the model ran, a token (or a failure) for every sample."""
    events = [(seq, _unfit_event(seq)) for seq in plan.finished]
    if not output.ran:
        return events
    for (seq, _row), token, scored in zip(plan.samples, output.sampled, output.logprobs, strict=True):
        if token is None:
            grammar_failed = seq.constraint is not None and seq.constraint.failure is not None
            error = TokenEvent(
                finish_reason="error", error=output.failures[seq], grammar_failed=grammar_failed
            )
            events.append((seq, error))
        else:
            events.append((seq, token_event(vocab, seq, token, scored, now)))
    return events


def _unfit_event(seq: Sequence) -> TokenEvent:
    """A sequence the KV memory cannot hold even alone: finished while planning."""
    error = "the request does not fit in the engine's KV memory" if seq.finish_reason == "error" else None
    return TokenEvent(finish_reason=seq.finish_reason, error=error)


def token_event(
    vocab: Vocabulary, seq: Sequence, token: int, logprobs: Logprobs | None, now: float
) -> TokenEvent:
    if seq.output:
        # The end-of-generation token is not part of the answer: no text, no log-probabilities.
        scored = None if vocab.is_end_of_generation(token) else logprobs
        event = TokenEvent(token_id=token, finish_reason=seq.finish_reason, logprobs=scored)
        # The end-of-generation token's bytes are none (a control token); a grammar's last token has its
        # text. A finish flushes a character left incomplete.
        piece = vocab.token_bytes(token)
        event.text = seq.text_decoder.decode(piece, final=seq.finish_reason is not None)
    else:  # max_tokens 0: the prompt was scored, nothing generated
        event = TokenEvent(finish_reason=seq.finish_reason)
    if not seq.first_token_at:
        seq.first_token_at = now
        event.cached_tokens = seq.num_cached_tokens
        event.queue_s = seq.admitted_at - seq.arrived_at
        event.grammar_s = seq.grammar_s
        event.prefill_s = now - seq.admitted_at
        if seq.request.prompt_logprobs is not None:
            event.prompt_logprobs = [Logprobs(seq.prompt[0], None, []), *seq.prompt_logprobs]
    return event
