"""``python -m bench.edge.fleet_parts``: what each part of fleet mode costs a non-streamed request, one part
at a time, beside the edge alone (``nearshore bench edge --fleet`` measures them all together).

One PostgreSQL, one Redis and an instant pacer (it answers a 1-token request at once); an edge per part:
alone, keys in PostgreSQL, the ledger also shipped to PostgreSQL, the limits in Redis, the cache shared
through Redis, and all of them. Each is driven by ``--clients`` closed-loop clients for ``--seconds`` per
round, the edges in the reverse order every other round. Printed per part: requests/s and the edge's CPU
per request (its process, every thread), and what the part adds to the edge alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from bench import peers
from bench.edge.fleet import CityStores
from bench.edge.throughput import closed_loop

PARTS = ("alone", "keys", "ledger", "limits", "cache", "all")


def sections_of(part: str, city: CityStores) -> dict[str, dict[str, object]]:
    every = city.sections()
    if part == "alone":
        return {}
    return every if part == "all" else {part: every[part]}


def run(parts: list[str], clients: int, seconds: float, rounds: int, logs: Path) -> list[dict]:
    city = CityStores(logs)
    pacer = peers.start_stand_in(logs, "pacer", "pacer-instant", tokens=1, interval_ms=0)
    edges = {}
    try:
        for part in parts:
            sections = sections_of(part, city)
            key = city.new_key() if "keys" in sections else ""
            edges[part] = peers.start_edge(
                logs, f"edge-{part}", pacer.url, tls=False, sections=sections, api_key=key
            )
        measured: dict[str, list[dict]] = {part: [] for part in parts}
        for i in range(rounds):
            for part in parts if i % 2 == 0 else parts[::-1]:
                measured[part].append(asyncio.run(closed_loop(edges[part], clients, seconds)))
    finally:
        for edge in edges.values():
            edge.stop()
        pacer.stop()
        city.stop()
    rows = []
    for part in parts:
        done = sum(m["done"] for m in measured[part])
        rows.append(
            {
                "part": part,
                "rps": done / sum(m["elapsed_s"] for m in measured[part]),
                "cpu_ms_per_request": sum(m["cpu_s"] for m in measured[part]) * 1000 / max(1, done),
                "errors": sum(m["errors"] for m in measured[part]),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.edge.fleet_parts", description=__doc__)
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, from: " + ", ".join(PARTS))
    parser.add_argument("--clients", type=int, default=50, help="closed-loop clients (default 50)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per part and round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, parts interleaved (default 3)")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--logs", default="", help="folder for logs (default: a temp folder)")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if not parts or any(p not in PARTS for p in parts):
        parser.error(f"--parts: choose from {', '.join(PARTS)}")
    logs = Path(args.logs or tempfile.mkdtemp(prefix="nearshore-fleet-parts-"))
    logs.mkdir(parents=True, exist_ok=True)
    rows = run(parts, args.clients, args.seconds, args.rounds, logs)
    alone = next((r for r in rows if r["part"] == "alone"), None)
    for row in rows:
        added = "" if alone is None else f" ({row['cpu_ms_per_request'] - alone['cpu_ms_per_request']:+.3f})"
        print(
            f"{row['part']:>7}: {row['rps']:6.0f} req/s, CPU {row['cpu_ms_per_request']:.3f} ms/req{added}, "
            f"{row['errors']} errors"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
