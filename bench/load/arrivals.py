"""When ``bench load`` sends: open-loop arrivals at a set rate, or a closed loop at a set concurrency.

Open loop: the gaps between arrivals are drawn from a gamma distribution of shape ``1 / burstiness`` and
mean ``1 / rate`` (vLLM's benchmark_serving does the same): burstiness 1 is a Poisson process (exponential
gaps, coefficient of variation 1); above 1 the arrivals come in bursts (CV = sqrt(burstiness)); below 1
they are more even than Poisson. A request is sent when it is due, whether or not earlier ones have
answered, so a slow server meets a queue, as it would in production. Every draw is seeded.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class OpenLoop:
    rate_rps: float
    burstiness: float = 1.0  # 1: Poisson; the gaps' CV is sqrt(burstiness)
    seed: int = 0

    def gaps_s(self) -> Iterator[float]:
        """Endless seeded gaps between arrivals, in seconds."""
        if self.rate_rps <= 0 or self.burstiness <= 0:
            raise ValueError("rate and burstiness must be positive")
        rng = random.Random(self.seed)
        shape = 1.0 / self.burstiness
        scale = 1.0 / (self.rate_rps * shape)  # mean = shape * scale = 1 / rate
        while True:
            yield rng.gammavariate(shape, scale)

    def offsets_s(self, duration_s: float) -> list[float]:
        """Arrival times from 0 (the first request at its first gap), all before ``duration_s``."""
        offsets: list[float] = []
        now_s = 0.0
        for gap_s in self.gaps_s():
            now_s += gap_s
            if now_s >= duration_s:
                return offsets
            offsets.append(now_s)
        return offsets  # not reached: the gaps never end


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` workers, each sending its next request as soon as its last one has ended."""

    concurrency: int


def parse_rates(text: str) -> list[float]:
    """``"1,2,4,8"`` -> [1.0, 2.0, 4.0, 8.0]: the rates of a sweep, requests per second."""
    rates = [float(part) for part in text.split(",") if part.strip()]
    if not rates or any(rate <= 0 for rate in rates):
        raise ValueError(f"rates must be positive numbers, comma-separated: {text!r}")
    return rates


def coefficient_of_variation(values: list[float]) -> float:
    """Standard deviation over mean (population); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / len(values)
    return variance**0.5 / mean
