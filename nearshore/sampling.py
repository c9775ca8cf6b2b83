"""One request's sampling parameters: what both engines read, the llama.cpp engine's numpy sampler
(regional/sampler.py) and the torch engine's batched sampler (gpu/sampler.py, through a
:class:`gpu.sampling_rows.SamplingRow` that holds them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None  # None: each engine draws one for the request
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) added to the logits before all else

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def repetition_penalised(self) -> bool:
        return self.repetition_penalty != 1.0
