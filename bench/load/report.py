"""``bench load``'s tables: the generator's ceiling first, then latency, then throughput and outcomes per
endpoint and step, the knee of a sweep, and a soak's growth."""

from __future__ import annotations

import math

import msgspec

from bench.load.soak import Growth
from bench.load.step_stats import Latency, StepSummary


class Ceiling(msgspec.Struct):
    """What one generator process sustains against a server that costs nothing."""

    requests_per_s: float
    tokens_per_s: float
    concurrency: int
    seconds: float
    client_cpu_share: float  # of one core, over the measurement
    errors: int


class LoadReport(msgspec.Struct):
    ceiling: Ceiling | None
    steps: list[StepSummary]
    knee_rps: dict[str, float]  # endpoint -> highest rate at which 90% met the objectives (NaN: none)
    soak: list[Growth]
    settings: dict


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _tails(latency: Latency, *names: str) -> str:
    return "/".join(_ms(getattr(latency, name)) for name in names)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def latency_table(summaries: list[StepSummary]) -> str:
    header = ["endpoint", "step", "TTFT p50/p90/p95/p99", "ITL p50/p95/p99", "TPOT p50/p99",
              "e2e p50/p95/p99", "TTFT mean", "lag p99"]  # fmt: skip
    rows = [
        [
            s.endpoint,
            s.step,
            _tails(s.ttft_ms, "p50", "p90", "p95", "p99"),
            _tails(s.itl_ms, "p50", "p95", "p99"),
            _tails(s.tpot_ms, "p50", "p99"),
            _tails(s.e2e_ms, "p50", "p95", "p99"),
            _ms(s.ttft_ms.mean),
            _ms(s.send_lag_ms.p99) if s.send_lag_ms is not None else "-",
        ]
        for s in summaries
    ]
    return "latency (ms, from each request's due time)\n" + _table(header, rows)


def outcome_table(summaries: list[StepSummary]) -> str:
    header = ["endpoint", "step", "sent", "ok", "req/s", "out tok/s", "goodput/s", "met", "cache H/S/M",
              "fresh H/S", "refused", "errors", "USD/Mtok"]  # fmt: skip
    rows = []
    for s in summaries:
        cache = "/".join(str(s.cache.get(kind, 0)) for kind in ("HIT", "SEMANTIC", "MISS"))
        fresh = s.cache_by_kind.get("fresh", {})
        fresh_hits = (
            f"{fresh.get('HIT', 0)}/{fresh.get('SEMANTIC', 0)}"  # new questions answered from the cache
        )
        rows.append(
            [
                s.endpoint,
                s.step,
                str(s.sent),
                str(s.ok),
                f"{s.request_rps:.2f}",
                f"{s.output_tokens_per_s:.1f}",
                f"{s.goodput_rps:.2f}",
                "-" if math.isnan(s.slo_met_share) else f"{s.slo_met_share:.0%}",
                cache,
                fresh_hits,
                " ".join(f"{code}:{n}" for code, n in s.refused.items()) or "0",
                " ".join(f"{kind}:{n}" for kind, n in s.errors.items()) or "0",
                "-" if math.isnan(s.usd_per_million_tokens) else f"{s.usd_per_million_tokens:.4f}",
            ]
        )
    slo = summaries[0].slo if summaries else "none"
    return f"throughput and outcomes (goodput: answers meeting {slo})\n" + _table(header, rows)


def format_report(report: LoadReport) -> str:
    parts = []
    if report.ceiling is not None:
        c = report.ceiling
        parts.append(
            f"generator ceiling (this process, zero-latency server, {c.concurrency} in flight, "
            f"{c.seconds:g} s): "
            f"{c.requests_per_s:.0f} req/s, {c.tokens_per_s:.0f} tok/s at {c.client_cpu_share:.0%} of a core"
            f"{f', {c.errors} errors' if c.errors else ''}; a result near this measures the client"
        )
    if report.steps:
        seed = report.settings.get("seed")
        parts.append(f"seed {seed} (--seed {seed} repeats these arrivals and prompts)")
        parts += [latency_table(report.steps), outcome_table(report.steps)]
    if report.knee_rps:
        knees = ", ".join(
            f"{name}: {'below the lowest rate' if math.isnan(rps) else f'{rps:g} rps'}"
            for name, rps in report.knee_rps.items()
        )
        parts.append(f"knee (highest rate at which >= 90% of requests met the objectives): {knees}")
    if report.soak:
        header = ["process", "pid", "samples", "RSS first/last MiB", "growth MiB", "MiB/h", "fds first/last",
                  "fds growth", "fds/h"]  # fmt: skip
        rows = [
            [
                g.name + (" (exited)" if g.exited else ""),
                str(g.pid),
                str(g.samples),
                f"{g.rss_first_mib:.1f}/{g.rss_last_mib:.1f}",
                f"{g.rss_growth_mib:+.1f}",
                f"{g.rss_slope_mib_per_h:+.1f}",
                f"{g.fds_first:.0f}/{g.fds_last:.0f}",
                f"{g.fds_growth:+.0f}",
                f"{g.fds_slope_per_h:+.1f}",
            ]
            for g in report.soak
        ]
        parts.append(
            "soak: growth (last 10% of samples minus first 10%; least-squares slope)\n" + _table(header, rows)
        )
    return "\n\n".join(parts)
