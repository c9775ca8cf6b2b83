"""``bench edge --routing on,off``: the edge with its route stage (geo.route = true) beside the same edge
without it, so that the report shows what routing adds to the edge's CPU per request.

Both run in front of the same catalog: three regions placed in London, Virginia and Johannesburg, every one
at the pacer, so the router ranks a real choice; and their clients come through a trusted proxy with a
Lagos address in X-Forwarded-For, so the GeoIP lookup is on the path too. Only ``geo.route`` differs.
With routing on alone (the default) the edge is started as before: one region, no proxy header.
"""

from __future__ import annotations

from pathlib import Path

from bench import peers
from bench.edge import paired
from bench.peers import Endpoint

MODES = {"on": True, "off": False}
OFF_SUFFIX = "-off"  # the path name of the edge with routing off, beside the one with it on
CATALOG_CITIES = ("london", "virginia", "johannesburg")
LAGOS_CLIENT = "105.112.1.1"  # GeoLite2 places it in Lagos


def parse_modes(text: str) -> list[bool]:
    """``on``, ``off`` or ``on,off`` as route flags, in order; ValueError for anything else."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(n not in MODES for n in names) or len(set(names)) != len(names):
        raise ValueError(f"--routing: give on, off or on,off (not {text!r})")
    return [MODES[n] for n in names]


def start_edges(logs: Path, name: str, pacer_url: str, modes: list[bool], *, tls: bool) -> list[Endpoint]:
    """One edge per mode: ``name`` for the first, ``name-off`` for routing off when both run."""
    compared = False in modes
    edges = []
    for route in modes:
        path = name + OFF_SUFFIX if not route and len(modes) > 1 else name
        if not compared:
            edges.append(peers.start_edge(logs, path, pacer_url, tls=tls))
            continue
        regions = [{"name": city, "city": city, "url": pacer_url} for city in CATALOG_CITIES]
        geo = {"route": route, "trusted_proxies": ["127.0.0.1/32"]}
        edge = peers.start_edge(logs, path, pacer_url, tls=tls, regions=regions, geo=geo)
        edge.headers["X-Forwarded-For"] = LAGOS_CLIENT
        edges.append(edge)
    return edges


def summary(rows: list[dict], throughput: list[dict] | None) -> list[dict]:
    """Routing on against off: CPU per stream at each level, and per non-streamed request."""
    return paired.compare(rows, throughput, "edge", "edge" + OFF_SUFFIX)


def print_summary(entries: list[dict]) -> None:
    paired.print_comparison("routing on vs off (the route stage: GeoIP + router, three regions)", entries)
