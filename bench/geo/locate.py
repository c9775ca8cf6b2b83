"""Micro-benchmark of where-the-client-is: ``client_address`` + ``locate`` per request, p50/p99 in
microseconds, on the LRU's hits and on its misses (``python -m bench.geo.locate``; part of ``bench geo``).

The request mix: public IPv4 and IPv6 peers, private peers, and clients behind one to three trusted proxies
(X-Forwarded-For chains, some with a malformed entry). Misses are measured on addresses never seen before.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable, Sequence

import msgspec

from geo.locate import Location, Locator
from harness.stats import percentile

TRUSTED_PROXIES = ("10.0.0.0/8", "fd00::/8")
# The edge's own location in the benchmark: Lagos.
EDGE_LOCATION = Location(latitude=6.4531, longitude=3.3958, country="NG", continent="AF", city="Lagos")
_IPV6_PREFIXES = (0x2001_4860, 0x2A00_1450, 0x2C0F_F7A8, 0x2C0F_FB18)  # Google, Google EU, Africa
Request = tuple[str | None, str | None]  # (socket peer, X-Forwarded-For)


class Timing(msgspec.Struct, frozen=True):
    """One phase's per-request cost."""

    phase: str
    num_requests: int
    p50_us: float
    p99_us: float
    mean_us: float


def _public_ipv4(rng: random.Random) -> str:
    while True:
        first = rng.randrange(1, 224)
        if first not in (10, 100, 127, 169, 172, 192):  # keep clear of the private and shared ranges
            return f"{first}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"


def _public_ipv6(rng: random.Random) -> str:
    prefix = rng.choice(_IPV6_PREFIXES)
    return f"{prefix >> 16:x}:{prefix & 0xFFFF:x}:{rng.randrange(1 << 16):x}::{rng.randrange(1, 1 << 16):x}"


def _proxy(rng: random.Random) -> str:
    return f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"


def make_requests(num_requests: int, rng: random.Random) -> list[Request]:
    """A mix of what an edge sees: 55% public IPv4 peers, 10% IPv6, 10% private, 25% behind proxies."""
    requests: list[Request] = []
    for _ in range(num_requests):
        kind = rng.random()
        if kind < 0.55:
            requests.append((_public_ipv4(rng), None))
        elif kind < 0.65:
            requests.append((_public_ipv6(rng), None))
        elif kind < 0.75:
            requests.append((f"192.168.{rng.randrange(256)}.{rng.randrange(1, 255)}", None))
        else:
            hops = [_public_ipv4(rng) if rng.random() < 0.8 else _public_ipv6(rng)]
            if rng.random() < 0.2:
                hops.insert(0, "not-an-address")  # a client's own garbage, left of the real hop
            hops += [_proxy(rng) for _ in range(rng.randrange(0, 3))]
            requests.append((_proxy(rng), ", ".join(hops)))
    return requests


def _time_each(
    requests: Sequence[Request], handle: Callable[[str | None, str | None], object]
) -> list[float]:
    clock = time.perf_counter_ns
    costs_ns: list[float] = []
    for peer, forwarded_for in requests:
        start_ns = clock()
        handle(peer, forwarded_for)
        costs_ns.append(clock() - start_ns)
    return costs_ns


def _timing(phase: str, costs_ns: Sequence[float]) -> Timing:
    return Timing(
        phase=phase,
        num_requests=len(costs_ns),
        p50_us=percentile(costs_ns, 50) / 1000,
        p99_us=percentile(costs_ns, 99) / 1000,
        mean_us=sum(costs_ns) / len(costs_ns) / 1000,
    )


def run(
    database: str | None = None, num_requests: int = 20000, working_set: int = 2000, seed: int = 9
) -> list[Timing]:
    """Time ``locate(client_address(peer, xff))`` on cache hits (a warm working set) and misses."""
    rng = random.Random(seed)
    locator = Locator(database, EDGE_LOCATION, TRUSTED_PROXIES, cache_size=max(working_set, 1))

    def handle(peer: str | None, forwarded_for: str | None) -> object:
        return locator.locate(locator.client_address(peer, forwarded_for))

    try:
        hot = make_requests(working_set, rng)
        _time_each(hot, handle)  # warm the LRU
        hits = [rng.choice(hot) for _ in range(num_requests)]
        fresh = make_requests(num_requests, rng)
        gc.collect()
        hit_costs = _time_each(hits, handle)
        locator.clear_cache()
        miss_costs = _time_each(fresh, handle)  # fresh addresses: every public one walks the tree
    finally:
        locator.close()
    return [_timing("hit", hit_costs), _timing("miss", miss_costs)]


def format_report(timings: Sequence[Timing]) -> str:
    lines = [
        "client_address + locate, per request",
        f"{'phase':<6}{'requests':>10}{'p50 us':>10}{'p99 us':>10}",
    ]
    for t in timings:
        lines.append(f"{t.phase:<6}{t.num_requests:>10}{t.p50_us:>10.2f}{t.p99_us:>10.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.geo.locate", description=__doc__.splitlines()[0])
    parser.add_argument("--database", default=None, help="a MaxMind DB file (default: the embedded GeoLite2)")
    parser.add_argument("--requests", type=int, default=20000, help="requests timed per phase")
    parser.add_argument("--working-set", type=int, default=2000, help="distinct requests in the hit phase")
    parser.add_argument("--seed", type=int, default=9)
    args = parser.parse_args(argv)
    print(format_report(run(args.database, args.requests, args.working_set, args.seed)))


if __name__ == "__main__":
    main()
