"""``bench edge``: one edge beside the same edge with one thing changed (its route stage off, the city's
fleet stores on, or TLS on), run side by side in one run: CPU and TTFT per stream at each level, CPU and
rate of the non-streamed requests."""

from __future__ import annotations

import math

STREAM_EDGE = "edge"  # the stream part's edge, the name every variant's path starts with
UNARY_EDGE = "edge-unary"  # the non-streamed part's
HTTPS_EDGE = STREAM_EDGE + "-https"  # the edge with TLS on (``--tls``), beside the edge with it off


def unary_path(path: str) -> str:
    """The non-streamed part's name for a stream part's path: an edge's is its own (``edge-fleet`` ->
    ``edge-unary-fleet``), a peer's the same (``nginx-https``)."""
    return UNARY_EDGE + path.removeprefix(STREAM_EDGE) if path.startswith(STREAM_EDGE) else path


def compare(rows: list[dict], throughput: list[dict] | None, on: str, off: str) -> list[dict]:
    """Path ``on`` against path ``off``, per request; empty where either did not run."""
    out = []
    by_key = {(r["path"], r["concurrency"]): r for r in rows}
    for (path, level), with_it in sorted(by_key.items(), key=lambda kv: kv[0][1]):
        without = by_key.get((off, level))
        if path == on and without is not None:
            entry = _entry(f"streams x{level}", with_it["cpu_ms_per_stream"], without["cpu_ms_per_stream"])
            for metric in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms"):
                entry[metric] = [with_it[metric], without[metric]]
            entry["ttft_p50_added_ms"] = with_it["ttft_p50_ms"] - without["ttft_p50_ms"]
            out.append(entry)
    unary = {row["path"]: row for row in throughput or []}
    if unary_path(on) in unary and unary_path(off) in unary:
        with_it, without = unary[unary_path(on)], unary[unary_path(off)]
        out.append(_entry("non-streamed", with_it["cpu_ms_per_request"], without["cpu_ms_per_request"]))
        out[-1]["rps"] = [with_it["rps"], without["rps"]]
    return out


def _entry(part: str, on_ms: float, off_ms: float) -> dict:
    added = on_ms - off_ms
    return {
        "part": part,
        "cpu_ms_on": on_ms,
        "cpu_ms_off": off_ms,
        "added_us": added * 1000,
        "added_pct": 100 * added / off_ms if off_ms > 0 else math.nan,
    }


def print_comparison(title: str, entries: list[dict]) -> None:
    if not entries:
        return
    print(f"\n{title}, per request (on / off):")
    for e in entries:
        line = (
            f"  {e['part']:<14} CPU {e['cpu_ms_on']:.3f} / {e['cpu_ms_off']:.3f} ms -> "
            f"{e['added_us']:+.0f} us ({e['added_pct']:+.1f}%)"
        )
        if "ttft_p50_ms" in e:
            (p50_on, p50_off), (p99_on, p99_off) = e["ttft_p50_ms"], e["ttft_p99_ms"]
            line += f"; TTFT p50 {p50_on:.2f} / {p50_off:.2f} ms, p99 {p99_on:.2f} / {p99_off:.2f} ms"
        if "rps" in e:
            line += f"; {e['rps'][0]:.0f} / {e['rps'][1]:.0f} req/s"
        print(line)
