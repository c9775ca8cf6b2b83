"""``bench load --charts DIR``: latency CDFs per endpoint, throughput and TTFT over time, and goodput vs
rate for a sweep. matplotlib comes with the ``harness`` extra; it is imported only here, only when asked."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.load.step_stats import Sample, StepSummary

BIN_S = 1.0


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _endpoints(samples: list[Sample]) -> list[str]:
    return list(dict.fromkeys(s.endpoint for s in samples))


def _cdf(axis: Any, values_s: list[float], label: str) -> None:
    values = sorted(v * 1000 for v in values_s if not math.isnan(v))
    if values:
        axis.plot(
            values, [(i + 1) / len(values) for i in range(len(values))], label=f"{label} (n={len(values)})"
        )


def latency_cdfs(plt: Any, samples: list[Sample], path: Path) -> Path:
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for name in _endpoints(samples):
        ok = [s for s in samples if s.endpoint == name and s.ok]
        _cdf(axes[0], [s.stream.ttft_s for s in ok if s.stream.tokens], name)
        _cdf(axes[1], [gap for s in ok for gap in s.stream.gaps_s], name)
        _cdf(axes[2], [s.stream.e2e_s for s in ok], name)
    for axis, title in zip(axes, ("TTFT", "inter-token latency", "end-to-end latency"), strict=True):
        axis.set_title(title)
        axis.set_xlabel("ms")
        axis.set_ylabel("share of requests" if title != "inter-token latency" else "share of gaps")
        axis.set_xscale("log")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def over_time(plt: Any, samples: list[Sample], path: Path) -> Path:
    figure, (throughput, ttft) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    requests_axis = throughput.twinx()
    ends_all = [s.sent_s + s.stream.e2e_s for s in samples if s.ok]
    # Bins wide enough that a slow load still reads as a rate (about 40 bins a run, at least 1 s).
    bin_s = max(BIN_S, max(ends_all, default=0.0) / 40)
    for name in _endpoints(samples):
        ok = [s for s in samples if s.endpoint == name and s.ok]
        if not ok:
            continue
        ends = [s.sent_s + s.stream.e2e_s for s in ok]
        bins = int(max(ends) / bin_s) + 1
        requests = [0.0] * bins
        tokens = [0.0] * bins
        for sample, end in zip(ok, ends, strict=True):
            requests[int(end / bin_s)] += 1 / bin_s
            tokens[int(end / bin_s)] += sample.completion_tokens / bin_s
        times = [(i + 0.5) * bin_s for i in range(bins)]
        (line,) = throughput.plot(times, tokens, label=f"{name} output tok/s")
        requests_axis.plot(times, requests, linestyle="--", color=line.get_color(), label=f"{name} req/s")
        ttft.scatter([s.sent_s for s in ok], [s.stream.ttft_s * 1000 for s in ok], s=6, label=name, alpha=0.6)
    throughput.set_ylabel(f"output tok/s (solid; {bin_s:.0f} s bins)")
    requests_axis.set_ylabel("answers/s (dashed)")
    throughput.legend(fontsize=8, loc="upper left")
    requests_axis.legend(fontsize=8, loc="upper right")
    throughput.grid(True, alpha=0.3)
    ttft.set_ylabel("TTFT ms (at the due time)")
    ttft.set_xlabel("seconds since the run started")
    ttft.set_yscale("log")
    ttft.legend(fontsize=8)
    ttft.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def goodput_vs_rate(plt: Any, summaries: list[StepSummary], path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(8, 5))
    names = list(dict.fromkeys(s.endpoint for s in summaries))
    top = 0.0
    for name in names:
        steps = sorted(
            (s for s in summaries if s.endpoint == name and not math.isnan(s.offered_rps)),
            key=lambda s: s.offered_rps,
        )
        rates = [s.offered_rps for s in steps]
        top = max([top, *rates])
        (line,) = axis.plot(rates, [s.goodput_rps for s in steps], marker="o", label=f"{name} goodput")
        axis.plot(
            rates, [s.request_rps for s in steps], marker="x", linestyle="--", color=line.get_color(),
            label=f"{name} throughput",
        )  # fmt: skip
    axis.plot([0, top], [0, top], color="grey", linewidth=0.8, label="offered")
    axis.set_xlabel("offered rate (req/s)")
    axis.set_ylabel("req/s")
    axis.set_title(f"goodput vs rate ({summaries[0].slo})")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def write_charts(folder: Path, samples: list[Sample], summaries: list[StepSummary]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    written = [
        latency_cdfs(plt, samples, folder / "latency_cdf.png"),
        over_time(plt, samples, folder / "over_time.png"),
    ]
    rates = {s.offered_rps for s in summaries if not math.isnan(s.offered_rps)}
    if len(rates) >= 2:
        written.append(goodput_vs_rate(plt, summaries, folder / "goodput_vs_rate.png"))
    return written
