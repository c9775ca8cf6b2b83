"""Micro-benchmark of the route stage's work per request, p50/p99 in microseconds, with catalogs of 3, 10
and 100 regions (``nearshore bench geo``, ``python -m bench.geo.route``).

Per request, as the edge's route stage does it: where the client is (``client_address`` + ``locate``, over
the embedded GeoLite2 or a given database, its LRU warm for most clients and cold for the rest), then the
decision (the prompt's prefix chain + ``Router.route``). Catalogs are made from real cloud-region cities,
jittered by up to half a degree, each region with a measured round trip above its fibre floor, a load
report, and a few replicas down, loading or with two replicas; an EU residency policy and a pinned tenant
apply to some requests. Prompts are short questions, or one of a few long documents with a question after
it (prefix affinity at work). Target (issue 9): lookup + decision under 50 us p99 at 100 regions.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import time
from collections.abc import Sequence

import msgspec

from bench.geo import locate as bench_locate
from geo.affinity import prefix_chain
from geo.catalog import GeoConfig, RegionSpec, ResidencyPolicy
from geo.locate import Locator
from geo.places import floor_one_way_ms, great_circle_km
from geo.route import NoRoute, Router, Where
from harness.stats import percentile
from nearshore.protocol.load import LoadReport

MODEL = "gemma-3-270m"
TARGET_US = 50.0
# Cloud-region cities (latitude, longitude, country, continent); the first three are the Lagos topology's.
CITIES = (
    ("london", 51.507, -0.128, "GB", "EU"),
    ("virginia", 39.044, -77.487, "US", "NA"),
    ("johannesburg", -26.204, 28.047, "ZA", "AF"),
    ("frankfurt", 50.111, 8.682, "DE", "EU"),
    ("paris", 48.857, 2.352, "FR", "EU"),
    ("dublin", 53.350, -6.260, "IE", "EU"),
    ("stockholm", 59.329, 18.069, "SE", "EU"),
    ("milan", 45.464, 9.190, "IT", "EU"),
    ("madrid", 40.417, -3.704, "ES", "EU"),
    ("warsaw", 52.230, 21.012, "PL", "EU"),
    ("zurich", 47.377, 8.541, "CH", "EU"),
    ("lisbon", 38.722, -9.139, "PT", "EU"),
    ("cape-town", -33.925, 18.424, "ZA", "AF"),
    ("nairobi", -1.292, 36.822, "KE", "AF"),
    ("lagos", 6.454, 3.395, "NG", "AF"),
    ("cairo", 30.044, 31.236, "EG", "AF"),
    ("ohio", 39.962, -83.000, "US", "NA"),
    ("oregon", 45.601, -121.184, "US", "NA"),
    ("california", 37.339, -121.895, "US", "NA"),
    ("montreal", 45.502, -73.567, "CA", "NA"),
    ("mexico-city", 19.433, -99.133, "MX", "NA"),
    ("sao-paulo", -23.551, -46.633, "BR", "SA"),
    ("santiago", -33.449, -70.669, "CL", "SA"),
    ("bahrain", 26.067, 50.558, "BH", "AS"),
    ("dubai", 25.205, 55.271, "AE", "AS"),
    ("tel-aviv", 32.085, 34.782, "IL", "AS"),
    ("mumbai", 19.076, 72.878, "IN", "AS"),
    ("hyderabad", 17.385, 78.487, "IN", "AS"),
    ("singapore", 1.352, 103.820, "SG", "AS"),
    ("jakarta", -6.209, 106.846, "ID", "AS"),
    ("hong-kong", 22.320, 114.169, "HK", "AS"),
    ("tokyo", 35.676, 139.650, "JP", "AS"),
    ("osaka", 34.694, 135.502, "JP", "AS"),
    ("seoul", 37.567, 126.978, "KR", "AS"),
    ("sydney", -33.869, 151.209, "AU", "OC"),
    ("melbourne", -37.814, 144.963, "AU", "OC"),
    ("auckland", -36.849, 174.763, "NZ", "OC"),
)
_WORDS = ("contract", "region", "latency", "party", "clause", "token", "cable", "ocean", "edge", "cache")


class SizeTiming(msgspec.Struct, frozen=True):
    """One catalog size's per-request costs, in microseconds."""

    num_regions: int
    num_replicas: int
    num_requests: int
    lookup_p50_us: float
    lookup_p99_us: float
    decision_p50_us: float
    decision_p99_us: float
    total_p50_us: float
    total_p99_us: float
    total_max_us: float
    refused: int  # requests no replica could take (a policy's regions all down): decided too


def make_catalog(num_regions: int, rng: random.Random) -> list[RegionSpec]:
    """``num_regions`` regions in real cities (cycled, jittered); one in six with two replicas."""
    specs = []
    for i in range(num_regions):
        city, lat, lon, country, continent = CITIES[i % len(CITIES)]
        urls = [f"http://10.{i // 200}.{i % 200}.{n + 1}:8100" for n in range(2 if i % 6 == 5 else 1)]
        specs.append(
            RegionSpec(
                name=f"{city}-{i}",
                replicas=urls,
                latitude=min(90.0, max(-90.0, lat + rng.uniform(-0.5, 0.5))),
                longitude=min(180.0, max(-180.0, lon + rng.uniform(-0.5, 0.5))),
                country=country,
                continent=continent,
                capacity=rng.choice((8, 16, 32, 64)),
            )
        )
    return specs


def make_router(num_regions: int, rng: random.Random) -> Router:
    """A router over a made-up catalog, in the state probes and answers leave it: round trips measured
    (1.1-2.5x the fibre floor), loads reported, first tokens observed, about 5% of replicas down and 3%
    loading."""
    specs = make_catalog(num_regions, rng)
    eu = [s.name for s in specs if s.continent == "EU"]
    policies = [ResidencyPolicy(name="eu-only", continents=["EU"], regions=eu)] if eu else []
    policies.append(ResidencyPolicy(name="pinned", tenants=["pinned"], regions=[specs[0].name]))
    router = Router.build(specs, GeoConfig(residency=policies), [MODEL])
    edge = router.edge
    for n, replica in enumerate(router.replicas):
        km = great_circle_km(edge.latitude, edge.longitude, replica.place.latitude, replica.place.longitude)
        load = LoadReport(
            state="loading" if n > 0 and rng.random() < 0.03 else "ready",
            running=rng.randrange(0, replica.spec.capacity + 1),
            waiting=rng.randrange(0, 4),
            capacity=replica.spec.capacity,
        )
        for _ in range(3):
            router.probe_passed(replica, 2 * floor_one_way_ms(km) * rng.uniform(1.1, 2.5), load)
        router.finished(replica, rng.uniform(500, 4000))
        # What real requests saw: first tokens beyond the round trip and prefill (the queue term).
        tokens = rng.randrange(10, 2000)
        ttft_ms = replica.latency.rtt_ms + 1000 * tokens / 2000 + rng.uniform(0, 300)
        router.answered(replica, ttft_ms, load, prompt_tokens=tokens, now=0.0)
        if n > 0 and rng.random() < 0.05:
            for _ in range(router.config.health.unhealthy_threshold):
                router.probe_failed(replica, "benchmark: down")
    return router


def make_prompts(num_prompts: int, rng: random.Random) -> list[str]:
    """Half short questions; half one of six long documents (2-12 kB) followed by a question."""
    sizes_chars = (2000, 3000, 4000, 6000, 9000, 12000)
    documents = [" ".join(rng.choice(_WORDS) for _ in range(size // 7)) for size in sizes_chars]
    prompts = []
    for n in range(num_prompts):
        question = f"Question {n}: what does clause {rng.randrange(100)} say about {rng.choice(_WORDS)}?"
        prompts.append(question if rng.random() < 0.5 else rng.choice(documents) + "\n" + question)
    return prompts


def run_size(
    locator: Locator,
    num_regions: int,
    num_requests: int = 20000,
    working_set: int = 2000,
    miss_share: float = 0.1,
    seed: int = 9,
) -> SizeTiming:
    """Time lookup and decision for ``num_requests`` requests against a ``num_regions`` catalog: clients
    from a warm working set, ``miss_share`` of them never seen before."""
    rng = random.Random(seed)
    router = make_router(num_regions, rng)
    routing = router.config.routing
    hot = bench_locate.make_requests(working_set, rng)
    clients = [
        bench_locate.make_requests(1, rng)[0] if rng.random() < miss_share else rng.choice(hot)
        for _ in range(num_requests)
    ]
    prompts = make_prompts(num_requests, rng)
    tenants = ["pinned" if rng.random() < 0.05 else "tenant" for _ in range(num_requests)]
    limit = routing.affinity_block_chars * 64
    locator.clear_cache()
    for peer, forwarded_for in hot:  # the working set is warm, as on an edge that has been serving
        location = locator.locate(locator.client_address(peer, forwarded_for))
        where = Where(location.latitude, location.longitude, location.country, location.continent, True)
        with contextlib.suppress(NoRoute):
            router.route(MODEL, where, "tenant", 10, (), 0.0)
    # Probes go on while it serves: each replica every health interval (10 s) at 1,000 requests a second
    # (the requests' clock below), each sample moving its round trip a little.
    probe_every = max(1, round(1000 * 10 / len(router.replicas)))
    clock = time.perf_counter_ns
    lookups, decisions, refused = [], [], 0
    gc.collect()
    for n, ((peer, forwarded_for), prompt, tenant) in enumerate(zip(clients, prompts, tenants, strict=True)):
        started = clock()
        location = locator.locate(locator.client_address(peer, forwarded_for))
        where = Where(
            location.latitude,
            location.longitude,
            location.country,
            location.continent,
            location.source == "geoip",
        )
        located = clock()
        text = prompt[:limit]
        prefix = prefix_chain(text, routing.affinity_block_chars, routing.affinity_min_chars)
        try:
            router.route(MODEL, where, tenant, len(text) // 4, prefix, n * 0.001)
        except NoRoute:
            refused += 1
        decided = clock()
        if n % probe_every == 0:
            replica = rng.choice(router.replicas)
            router.probe_passed(replica, replica.latency.rtt_ms * rng.uniform(0.9, 1.1), replica.load)
        lookups.append(located - started)
        decisions.append(decided - located)
    totals = [a + b for a, b in zip(lookups, decisions, strict=True)]
    return SizeTiming(
        num_regions=num_regions,
        num_replicas=len(router.replicas),
        num_requests=num_requests,
        lookup_p50_us=percentile(lookups, 50) / 1000,
        lookup_p99_us=percentile(lookups, 99) / 1000,
        decision_p50_us=percentile(decisions, 50) / 1000,
        decision_p99_us=percentile(decisions, 99) / 1000,
        total_p50_us=percentile(totals, 50) / 1000,
        total_p99_us=percentile(totals, 99) / 1000,
        total_max_us=max(totals) / 1000,
        refused=refused,
    )


def run(
    sizes: Sequence[int] = (3, 10, 100),
    database: str | None = None,
    num_requests: int = 20000,
    working_set: int = 2000,
    seed: int = 9,
) -> dict:
    """The lookup alone (bench_locate: LRU hits and misses), then lookup + decision per catalog size."""
    report: dict = {
        "locate": bench_locate.run(database, num_requests, working_set, seed),
        "sizes": [],
    }
    locator = Locator(
        database, bench_locate.EDGE_LOCATION, bench_locate.TRUSTED_PROXIES, cache_size=max(working_set, 1)
    )
    try:
        for size in sizes:
            report["sizes"].append(run_size(locator, size, num_requests, working_set, seed=seed))
    finally:
        locator.close()
    largest = max(report["sizes"], key=lambda t: t.num_regions)
    report["target"] = {
        "target": f"lookup + decision < {TARGET_US:g} us p99 at {largest.num_regions} regions",
        "value_us": largest.total_p99_us,
        "met": largest.total_p99_us < TARGET_US,
    }
    return report


def format_report(report: dict) -> str:
    lines = [bench_locate.format_report(report["locate"]), ""]
    lines.append(
        "route stage per request, us: lookup = client_address + locate (10% new clients), "
        "decision = prefix chain + Router.route"
    )
    header = (
        f"{'regions':>7} {'replicas':>8} {'requests':>8} | {'lookup p50':>10} {'p99':>6} | "
        f"{'decision p50':>12} {'p99':>6} | {'total p50':>9} {'p99':>6} {'max':>7}"
    )
    lines += [header, "-" * len(header)]
    for t in report["sizes"]:
        lines.append(
            f"{t.num_regions:>7} {t.num_replicas:>8} {t.num_requests:>8} | {t.lookup_p50_us:>10.2f} "
            f"{t.lookup_p99_us:>6.2f} | {t.decision_p50_us:>12.2f} {t.decision_p99_us:>6.2f} | "
            f"{t.total_p50_us:>9.2f} {t.total_p99_us:>6.2f} {t.total_max_us:>7.0f}"
        )
    target = report["target"]
    verdict = "met" if target["met"] else "MISSED"
    lines.append(f"\ntarget: {target['target']}: {target['value_us']:.2f} us -> {verdict}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="3,10,100", help="catalog sizes in regions (default 3,10,100)")
    parser.add_argument("--database", default=None, help="a MaxMind DB file (default: the embedded GeoLite2)")
    parser.add_argument("--requests", type=int, default=20000, help="requests timed per size (default 20000)")
    parser.add_argument("--working-set", type=int, default=2000, help="distinct warm clients (default 2000)")
    parser.add_argument("--seed", type=int, default=9)


def run_from_args(args: argparse.Namespace) -> dict:
    sizes = [int(x) for x in args.sizes.split(",") if x]
    return run(sizes, args.database, args.requests, args.working_set, args.seed)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.geo.route", description=__doc__.splitlines()[0])
    add_arguments(parser)
    print(format_report(run_from_args(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
