"""How long a replica takes: round trip, first token and service time, as moving averages.

Until a path is measured its round trip is the speed-of-light floor for the great-circle distance times a
path-inflation factor; once probes time it, an exponentially weighted moving average of what they saw, but
never below the floor itself: a replica that answers faster than light allows from the place the catalog
gives it is not where the catalog says (a test bench on loopback, or a wrong city), and the catalog is what
the operator routes by. The whole service time of real requests is averaged the same way and feeds the
queueing estimate.

What the router scores from real requests is :class:`Observed`: the first-token time beyond what probes
explain (the round trip and the prompt's expected prefill), so that a replica that answers ``/health`` at once
and reports an idle batch but is slow in practice looks slow. An estimate with no sample for ``stale_after_s``
is not averaged with: the next sample (the router's exploration of a replica it stopped sending to,
:mod:`geo.hold`) replaces it if lower, so a recovered replica is seen to be at once.

A sample may raise a fresh estimate only as far as another recent sample corroborates it: another
source's (the edge gives each sample its request's tenant), else the same source's last. A replica that is
slow is slow for everyone, while one request can be slow for its own reasons (a prompt whose prefill the
estimate underrates, many choices, a region's pause): taken alone, one tenant's slow request made the
replica look slower than a farther region and moved every user's traffic away until it was explored again.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

# A sample's weight shrinks with the prefill it had to subtract (the estimate of a long prompt's prefill is
# the noisiest part of it): weight 1 / (1 + prefill_ms / this). A 4k-token prompt at 2,000 tokens/s counts a
# fifth of a short chat.
PREFILL_NOISE_MS = 500.0
# The recent samples (source, excess, when) a raise is corroborated by.
_WITNESSES = 8
# A probe's round trip over this many times the estimate waits for the next probe to agree.
RTT_SPIKE_RATIO = 2.0


@dataclass(slots=True)
class Ewma:
    alpha: float
    value: float = 0.0
    samples: int = 0

    def add(self, x: float) -> None:
        self.value = x if self.samples == 0 else self.value + self.alpha * (x - self.value)
        self.samples += 1


@dataclass(slots=True)
class Observed:
    """Milliseconds of first-token time that probes do not explain, as real requests saw them."""

    alpha: float
    stale_after_s: float
    value: float = 0.0
    samples: int = 0
    at: float = -math.inf  # when the last sample came (monotonic seconds)
    recent: deque[tuple[str, float, float]] = field(default_factory=lambda: deque(maxlen=_WITNESSES))

    def add(self, excess_ms: float, now: float, weight: float = 1.0, source: str = "") -> None:
        """A request of ``source`` (who asked: its tenant) saw ``excess_ms``."""
        if self.stale(now):
            # Nothing fresh to weigh it against (an exploration's sample, or the first after a quiet spell):
            # lower, it replaces the estimate (a recovered replica is seen at once); higher, it waits for a
            # witness as a raise does, the old estimate standing until then. The very first sample is taken.
            self.value = min(excess_ms, self.value) if self.samples else excess_ms
        else:
            self.value += self.alpha * weight * (self._corroborated(excess_ms, now, source) - self.value)
        self.recent.append((source, excess_ms, now))
        self.samples += 1
        self.at = now

    def _corroborated(self, excess_ms: float, now: float, source: str) -> float:
        """``excess_ms``, or where it would raise the estimate, no more than the latest fresh sample of
        another source saw (else the same source's last): one request alone cannot make a replica slow."""
        if excess_ms <= self.value:
            return excess_ms
        witness = None
        for seen_by, seen_ms, seen_at in reversed(self.recent):
            if now - seen_at >= self.stale_after_s:
                break
            if seen_by != source:
                witness = seen_ms
                break
            if witness is None:
                witness = seen_ms  # the same source's last: used when no other source has a fresh one
        return excess_ms if witness is None else min(excess_ms, witness)

    def stale(self, now: float) -> bool:
        """No sample for ``stale_after_s`` (or none at all): what it says may no longer hold."""
        return now - self.at >= self.stale_after_s


@dataclass(slots=True)
class Latency:
    floor_rtt_ms: float  # light in fibre over the great circle, both ways
    inflation: float
    alpha: float
    stale_after_s: float = 10.0  # of the observed excess (RoutingSettings.explore_after_s)
    rtt: Ewma = None  # type: ignore[assignment]
    ttft: Ewma = None  # type: ignore[assignment]  # as seen, prefill and round trip included
    service: Ewma = None  # type: ignore[assignment]
    decode: Ewma = None  # type: ignore[assignment]  # ms per generated token, from its streams
    observed: Observed = None  # type: ignore[assignment]
    explored_at: float = -math.inf  # when the router last sent it a request to re-measure it
    last_probe_ms: float = math.inf  # the previous probe's round trip, as timed

    def __post_init__(self) -> None:
        self.rtt, self.ttft, self.service = Ewma(self.alpha), Ewma(self.alpha), Ewma(self.alpha)
        self.decode = Ewma(self.alpha)
        self.observed = Observed(self.alpha, self.stale_after_s)

    @property
    def rtt_ms(self) -> float:
        if self.rtt.samples:
            return max(self.rtt.value, self.floor_rtt_ms)
        return self.floor_rtt_ms * self.inflation

    def probe_round_trip(self, rtt_ms: float) -> None:
        """A probe's round trip. One over ``RTT_SPIKE_RATIO`` times the estimate counts only as far as the
        previous probe's: one answer held up at the node (a pause, a process just restarted, a retransmit)
        would otherwise lift the average for the seconds it takes to forget it, long enough to move the
        traffic of everyone routed there; a path that did get slower shows on its next probe."""
        previous, self.last_probe_ms = self.last_probe_ms, rtt_ms
        if self.rtt.samples and rtt_ms > RTT_SPIKE_RATIO * self.rtt.value:
            rtt_ms = min(rtt_ms, previous)
        self.rtt.add(rtt_ms)

    @property
    def below_floor(self) -> bool:
        """Measured faster than light allows: the catalog's place for it is likely wrong."""
        return self.rtt.samples > 0 and self.rtt.value < 0.5 * self.floor_rtt_ms

    @property
    def measured(self) -> bool:
        return self.rtt.samples > 0

    def service_ms(self, default_ms: float) -> float:
        return self.service.value if self.service.samples else default_ms

    def stream_ended(self, service_ms: float, first_token_ms: float, tokens: int) -> None:
        """A stream's tokens after its first came in ``service_ms - first_token_ms``: its decode speed."""
        if tokens > 1 and service_ms > first_token_ms:
            self.decode.add((service_ms - first_token_ms) / (tokens - 1))

    def unary_answer(
        self,
        total_ms: float,
        prefill_ms: float,
        tokens: int,
        default_decode_ms: float,
        now: float,
        source: str = "",
    ) -> None:
        """A whole non-streamed answer of ``tokens`` took ``total_ms``: what its decode (at the speed its
        streams showed, else ``default_decode_ms`` a token) and the round trip and prefill do not explain
        was queue, as a stream's late first token is. A replica slow at unary answers looks slow, though it
        answers /health at once and reports an idle batch. The sample weighs less the more it subtracts."""
        decode_ms = tokens * (self.decode.value if self.decode.samples else default_decode_ms)
        excess_ms = max(0.0, total_ms - self.rtt_ms - prefill_ms - decode_ms)
        weight = 1.0 / (1.0 + (prefill_ms + decode_ms) / PREFILL_NOISE_MS)
        self.observed.add(excess_ms, now, weight, source)

    def first_token(
        self, ttft_ms: float, prefill_ms: float, now: float, upper_bound: bool = False, source: str = ""
    ) -> None:
        """A real request's first token came ``ttft_ms`` after it left (the prompt's expected prefill
        ``prefill_ms``). ``upper_bound``: the time of a whole non-streamed answer, which bounds its first
        token from above, so it may only lower the estimate."""
        self.ttft.add(ttft_ms)
        excess_ms = max(0.0, ttft_ms - self.rtt_ms - prefill_ms)
        if upper_bound and (self.observed.samples == 0 or excess_ms >= self.observed.value):
            return
        self.observed.add(excess_ms, now, 1.0 / (1.0 + prefill_ms / PREFILL_NOISE_MS), source)
