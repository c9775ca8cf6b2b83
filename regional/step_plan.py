"""One step's plan: the memory changes, then the batch the model runs and who samples from it.

The scheduler builds it (:meth:`regional.scheduler.Scheduler.schedule`), the engine applies and runs it,
the scheduler takes in what the step gave (:meth:`regional.scheduler.Scheduler.postprocess`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from regional.kv_memory import Admission
from regional.sequence import Sequence


@dataclass(slots=True)
class StepPlan:
    """Everything one step needs: memory changes first, then one model call over the batch."""

    admissions: list[Admission] = field(default_factory=list)
    # The batch: one row per token.
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    want_logits: list[bool] = field(default_factory=list)
    # (sequence, batch row of its logits): the sequences that sample a token after this step
    samples: list[tuple[Sequence, int]] = field(default_factory=list)
    # (sequence, tokens it adds to its KV this step)
    advances: list[tuple[Sequence, int]] = field(default_factory=list)
    # Sequences finished while planning: the KV memory cannot hold them even alone (never in the batch)
    finished: list[Sequence] = field(default_factory=list)
    # (sequence, first batch row, rows): prompt rows whose logits score the next prompt token, for the
    # sequences that asked for prompt log-probabilities (rows scored before a recompute are not again)
    prompt_rows: list[tuple[Sequence, int, int]] = field(default_factory=list)
    # Slots whose idle caches were dropped because the model had no room for the last batch: their cells
    # are cleared first, before the admissions' changes
    cleared: list[int] = field(default_factory=list)

    @property
    def evictions(self) -> list[int]:
        """Slots whose idle caches were dropped this step: their cells must be cleared."""
        return [*self.cleared, *(slot for a in self.admissions for slot in a.evicted)]

    def add(self, seq: Sequence, tokens: list[int], sample: bool) -> None:
        start, first_row = seq.num_computed, len(self.tokens)
        for offset, token in enumerate(tokens):
            self.tokens.append(token)
            self.positions.append(start + offset)
            self.seq_ids.append(seq.slot)
            self.want_logits.append(False)
        if seq.request.prompt_logprobs is not None:
            # Positions begin..end-1 predict prompt tokens begin+1..end; the last prompt position predicts
            # the first output token, which the sample scores.
            begin = max(start, len(seq.prompt_logprobs))
            end = min(start + len(tokens), len(seq.prompt) - 1)
            if begin < end:
                rows = range(first_row + begin - start, first_row + end - start)
                for row in rows:
                    self.want_logits[row] = True
                self.prompt_rows.append((seq, rows.start, len(rows)))
        if sample:
            self.want_logits[-1] = True
            self.samples.append((seq, len(self.tokens) - 1))
        self.advances.append((seq, len(tokens)))
