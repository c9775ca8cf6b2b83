"""One row of the batched sampler: the request's :class:`nearshore.sampling.SamplingParams` (the same object
the llama.cpp engine's sampler reads), its random stream and what it has drawn; what the torch sampler
(gpu/sampler.py) and the fused CUDA kernel's launcher (gpu/cuda_kernels.py) both read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from nearshore.sampling import SamplingParams

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
class SamplingRow:
    """One row's sampling: the request's parameters (held, not copied), its seed, what it has seen so far."""

    params: SamplingParams
    seed: int = 0  # the stream's seed, resolved (a request without one has been given one)
    index: int = 0  # which output token this draw is (0 for the first): the random stream's counter
    output_counts: dict[int, int] = field(default_factory=dict)  # generated token -> times
    prompt_tokens: Sequence[int] = ()  # for the repetition penalty
    logprobs: int | None = None  # top-N log-probabilities to return (0: the chosen token's only)
