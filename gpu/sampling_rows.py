"""One row's sampling parameters and its random stream: what the torch sampler (gpu/sampler.py) and the
fused CUDA kernel's launcher (gpu/cuda_kernels.py) both read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed: int, index: int) -> float:
    """A number in [0, 1) from (seed, index) alone: counter-based, so no state travels with a request."""
    return (_splitmix64(_splitmix64(seed & MASK64) ^ (index & MASK64)) >> 11) * (1.0 / (1 << 53))


@dataclass(slots=True)
class RowParams:
    """One row's sampling: the request's parameters, its seed, and what it has seen so far."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0
    index: int = 0  # which output token this draw is (0 for the first): the random stream's counter
    output_counts: dict[int, int] = field(default_factory=dict)  # generated token -> times
    prompt_tokens: Sequence[int] = ()  # for the repetition penalty
    logprobs: int | None = None  # top-N log-probabilities to return (0: the chosen token's only)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) added to the logits before all else

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1
