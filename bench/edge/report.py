"""``bench edge``'s report: ratios to the peers, the issue's targets, and the printed tables."""

from __future__ import annotations

import math

from bench import peers
from bench.edge import paired
from bench.edge import routing as edge_routing
from bench.edge.rps import RPS_OVERHEAD_LIMIT_MS


def finite(value: object) -> object:
    """NaN (a number with no samples) becomes null, so the JSON file is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def _row(rows: list[dict], path: str, level: int) -> dict | None:
    return next((r for r in rows if r["path"] == path and r["concurrency"] == level), None)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else math.nan


def ratios(rows: list[dict]) -> list[dict]:
    out = []
    for level in sorted({r["concurrency"] for r in rows}):
        edge, nginx, litellm, floor, frame, lean = (
            _row(rows, p, level) for p in ("edge", "nginx", "litellm", "floor", "frame", "lean")
        )
        if edge is None:
            continue
        entry: dict = {"concurrency": level}
        if floor is not None and nginx is not None:  # the runtime's own share of the gap to nginx
            entry["floor_over_nginx_cpu_ms_per_stream"] = _ratio(
                floor["cpu_ms_per_stream"], nginx["cpu_ms_per_stream"]
            )
        others = (("nginx", nginx), ("litellm", litellm), ("floor", floor), ("frame", frame), ("lean", lean))
        for name, peer in others:
            if peer is None:
                continue
            for metric in (
                "ttft_p50_overhead_ms",
                "e2e_p50_overhead_ms",
                "e2e_p99_overhead_ms",
                "cpu_ms_per_stream",
            ):
                entry[f"edge_over_{name}_{metric}"] = _ratio(edge[metric], peer[metric])
        out.append(entry)
    return out


def targets(rows: list[dict], throughput: list[dict] | None = None, ttft: bool = True) -> list[dict]:
    """The issue's targets (issue 8), each with the measured number and whether it was met; ``ttft`` False
    (the pacer on a step clock, where a first token waits for the next step) leaves the TTFT targets out:
    they are set on each stream's own clock, and on steps an overhead shows in whole steps or not at all."""
    out = []
    for level, limit in ((1, 0.5), (50, 3.0)) if ttft else ():
        edge = _row(rows, "edge", level)
        if edge:
            value = edge["ttft_p50_overhead_ms"]
            target = f"+TTFT p50 < {limit:g} ms at x{level}"
            out.append({"target": target, "value_ms": value, "met": value < limit})
    for level in (10, 50):
        edge, nginx = _row(rows, "edge", level), _row(rows, "nginx", level)
        if edge and nginx:
            cpu, floor = edge["cpu_ms_per_stream"], nginx["cpu_ms_per_stream"]
            target = f"CPU per streamed request within 2x nginx's at x{level}"
            out.append({"target": target, "value_ms": cpu, "nginx_ms": floor, "met": cpu <= 2 * floor})
    for edge in (r for r in rows if r["path"] == "edge"):
        extra = edge["bunched_pct"] - (_row(rows, "direct", edge["concurrency"]) or edge)["bunched_pct"]
        target = f"no bunching at x{edge['concurrency']} (bunched % - direct's < 1)"
        out.append({"target": target, "value_pct": extra, "met": extra < 1.0})
    by_path = {row["path"]: row for row in throughput or []}
    if "edge-unary" in by_path and "nginx" in by_path:
        ratio = by_path["edge-unary"]["rps"] / by_path["nginx"]["rps"]
        target = "non-streamed throughput at least half of nginx's"
        out.append({"target": target, "value_ratio": ratio, "met": ratio >= 0.5})
    return out


def print_tls_ratios(rows: list[dict], throughput: list[dict] | None) -> None:
    """The edge against nginx with TLS on both, as a city's users reach them."""
    parts = []
    for level in sorted({r["concurrency"] for r in rows}):
        edge, nginx = _row(rows, paired.HTTPS_EDGE, level), _row(rows, peers.NGINX_HTTPS, level)
        if edge and nginx:
            parts.append(f"x{level} " + _vs(edge["cpu_ms_per_stream"], nginx["cpu_ms_per_stream"]))
    by_path = {row["path"]: row for row in throughput or []}
    edge_unary = paired.unary_path(paired.HTTPS_EDGE)
    if edge_unary in by_path and peers.NGINX_HTTPS in by_path:
        ratio = by_path[edge_unary]["rps"] / by_path[peers.NGINX_HTTPS]["rps"]
        parts.append(f"non-streamed requests/s {ratio:.2f}x nginx's")
    if parts:
        print("with TLS on both, the edge's CPU per stream vs nginx's: " + "; ".join(parts))


def _vs(ours: float, theirs: float) -> str:
    ratio = _ratio(ours, theirs)
    return f"{ours:.2f} vs {theirs:.2f} ms ({'n/a' if math.isnan(ratio) else f'{ratio:.1f}x'})"


def _f(value: float, width: int, digits: int = 2) -> str:
    return f"{'-':>{width}}" if value is None or math.isnan(value) else f"{value:{width}.{digits}f}"


def print_report(report: dict) -> None:
    rows = report["streams"]
    header = (
        f"{'path':>8} {'conc':>4} {'streams':>7} | {'TTFT p50':>8} {'p99':>7} {'e2e p50':>8} {'p99':>7} | "
        f"{'+TTFT p50':>9} {'p99':>6} {'+e2e p50':>8} {'p99':>6} | "
        f"{'tail':>5} {'CPU/str':>7} {'gap p99':>7} {'bunched':>7} {'err':>3}"
    )
    print(
        "\nall times in ms; +X = X minus direct's at the same concurrency; tail = last token -> [DONE], p50;"
        "\nCPU/str = the proxy's CPU per stream; bunched = gaps under a quarter of the pacer's interval"
    )
    print(header + "\n" + "-" * len(header))
    level = None
    for r in rows:
        if level is not None and r["concurrency"] != level:
            print()
        level = r["concurrency"]
        cpu = _f(r["cpu_ms_per_stream"], 7) if r["path"] != "direct" else f"{'-':>7}"
        print(
            f"{r['path']:>8} {r['concurrency']:>4} {r['streams']:>7} | {_f(r['ttft_p50_ms'], 8)} "
            f"{_f(r['ttft_p99_ms'], 7)} {_f(r['e2e_p50_ms'], 8)} {_f(r['e2e_p99_ms'], 7)} | "
            f"{_f(r['ttft_p50_overhead_ms'], 9)} {_f(r['ttft_p99_overhead_ms'], 6)} "
            f"{_f(r['e2e_p50_overhead_ms'], 8)} {_f(r['e2e_p99_overhead_ms'], 6)} | "
            f"{_f(r['tail_p50_ms'], 5)} {cpu} "
            f"{_f(r['gap_p99_ms'], 7)} {_f(r['bunched_pct'], 6, 1)}% {r['errors']:>3}"
        )
    print()
    for entry in report["ratios"]:
        level = entry["concurrency"]
        edge = _row(rows, "edge", level)
        for peer in ("nginx", "litellm", "floor", "frame", "lean"):
            other = _row(rows, peer, level)
            if other is None:
                continue
            parts = [
                f"{label} {_vs(edge[metric], other[metric])}"
                for label, metric in (
                    ("+e2e p50", "e2e_p50_overhead_ms"),
                    ("+TTFT p50", "ttft_p50_overhead_ms"),
                    ("CPU/stream", "cpu_ms_per_stream"),
                )
            ]
            print(f"x{level:<4} edge vs {peer:<7}: " + "; ".join(parts))
    print("\ntargets:")
    for t in report["targets"]:
        if "value_pct" in t:
            value = f"{t['value_pct']:.1f} points"
        elif "value_ratio" in t:
            value = f"{t['value_ratio']:.2f}x nginx's rate"
        elif "nginx_ms" in t:
            value = _vs(t["value_ms"], t["nginx_ms"]) + " nginx's"
        else:
            value = f"{t['value_ms']:.2f} ms"
        print(f"  {t['target']:<48} {value} -> {'met' if t['met'] else 'MISSED'}")
    pacer = ", ".join(
        f"x{r['concurrency']} {r['pacer_cpu_ms_per_stream']:.2f}" for r in rows if r["path"] == "direct"
    )
    print(f"  for scale, the pacer's own CPU per stream, ms: {pacer}")
    own = ", ".join(
        f"x{r['concurrency']} {r['server_timing_edge_p50_ms']:.2f}/{r['server_timing_edge_p99_ms']:.2f}"
        for r in rows
        if r["path"] == "edge"
    )
    print(f"  the edge's own Server-Timing edge;dur (arrival -> forwarded), p50/p99 ms: {own}")
    rps = report.get("rps")
    if rps:
        print(
            f"\nmax RPS of one edge process with p99 overhead < {RPS_OVERHEAD_LIMIT_MS:g} ms and no errors:"
        )
        for name, label in (("edge-rps", "plain HTTP"), ("edge-tls", "TLS")):
            first_fail = next((s for s in rps["steps"] if s["path"] == name and not s.get("passed")), None)
            why = ""
            if first_fail:
                why = (
                    f" (at {first_fail['rate']:.0f}/s: +{first_fail['p99_overhead_ms']:.1f} ms p99, "
                    f"{first_fail['errors']} errors)"
                )
            elif rps["steps"]:
                why = " (no failure within the ramp: the real limit is higher)"
            print(f"  {label:<10} {rps['max_rps'][name]:6.0f}/s{why}")
    throughput = {row["path"]: row for row in report.get("throughput", [])}
    if "edge-unary" in throughput:
        edge, nginx = throughput["edge-unary"], throughput.get("nginx")
        line = (
            f"\nnon-streamed, closed loop: edge {edge['rps']:.0f} req/s, "
            f"{edge['cpu_ms_per_request']:.3f} ms CPU each"
        )
        if nginx:
            line += (
                f"; nginx {nginx['rps']:.0f} req/s, {nginx['cpu_ms_per_request']:.3f} ms"
                f" -> edge at {edge['rps'] / nginx['rps']:.2f}x nginx's rate"
            )
        if floor := throughput.get("floor"):
            line += f"; the bare Python relay {floor['rps']:.0f} req/s, {floor['cpu_ms_per_request']:.3f} ms"
        if frame := throughput.get("frame"):
            line += f"; the edge's frame {frame['rps']:.0f} req/s, {frame['cpu_ms_per_request']:.3f} ms"
        if lean := throughput.get("lean"):
            line += (
                f"; the frame on the lean core {lean['rps']:.0f} req/s, {lean['cpu_ms_per_request']:.3f} ms"
            )
        print(line + f" (the direct path: {throughput['direct']['rps']:.0f} req/s, the client's ceiling)")
    edge_routing.print_summary(report.get("routing", []))
    paired.print_comparison(
        "fleet mode vs the edge alone (keys, ledger in PostgreSQL; limits, cache through Redis)",
        report.get("fleet", []),
    )
    paired.print_comparison(
        "TLS on vs off (the edge terminating TLS, as it does by default)", report.get("tls", [])
    )
    paired.print_comparison("TLS on vs off for nginx", report.get("tls_nginx", []))
    print_tls_ratios(rows, report.get("throughput"))
    idle = ", ".join(f"{k} {v:.1f}" for k, v in report.get("idle_cpu_ms_per_s", {}).items())
    if idle:
        print(f"idle CPU, ms per second with no load: {idle}")
    for note in report["notes"]:
        print(f"note: {note}")
    env = report["environment"]
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    print(f"took {report['elapsed_s']:.0f} s; logs: {report['logs']}")
