"""The traffic chart the routing scenarios share: requests per region over time, and time to first token
over time, with the scenario's phases marked on both."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.scenarios.traffic import FAILED_BEFORE_FIRST_BYTE, Attempt

BIN_S = 1.0


def traffic_chart(
    path: Path,
    attempts: Sequence[Attempt],
    t0: float,
    phases: Sequence[tuple[str, float, float]],
    title: str,
    events: Sequence[tuple[str, float]] = (),
) -> Path:
    """``phases``: (label, start, end) in perf_counter seconds; ``events``: (label, time) drawn as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    regions = sorted({a.region for a in attempts if a.served}, key=lambda r: min_start(attempts, r))
    colours = {r: f"C{i}" for i, r in enumerate(regions)}
    end = max([a.started - t0 for a in attempts] + [p[2] - t0 for p in phases] + [BIN_S])
    bins = int(end // BIN_S) + 1
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=[1, 1.4])

    # Requests per region per second, stacked, by when each was sent.
    below = [0] * bins
    for region in regions:
        counts = [0] * bins
        for a in attempts:
            if a.served and a.region == region:
                counts[int((a.started - t0) // BIN_S)] += 1
        top.bar(
            [i * BIN_S for i in range(bins)],
            counts,
            width=BIN_S,
            bottom=below,
            align="edge",
            color=colours[region],
            label=region,
        )
        below = [b + c for b, c in zip(below, counts, strict=True)]
    failed = [0] * bins
    for a in attempts:
        if a.outcome == FAILED_BEFORE_FIRST_BYTE:
            failed[int((a.started - t0) // BIN_S)] += 1
    if any(failed):
        top.bar(
            [i * BIN_S for i in range(bins)],
            failed,
            width=BIN_S,
            bottom=below,
            align="edge",
            color="red",
            label="failed before first byte",
        )
    top.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    top.set_ylabel("requests sent / s")
    top.legend(fontsize=8, loc="upper right")

    # Time to first token of each request, at the time it was sent; red crosses for failures.
    # (log scale: a spike of a few hundred ms and a stall of seconds both stay readable)
    for a in attempts:
        if a.served:
            marker = "o" if a.outcome == "ok" else "^"
            bottom.scatter(a.started - t0, a.ttft_s * 1000, s=12, marker=marker, color=colours[a.region])
        else:
            bottom.axvline(a.started - t0, color="red", linewidth=0.8, alpha=0.6)
    bottom.set_yscale("log")
    plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")
    bottom.yaxis.set_major_formatter(plain)
    bottom.yaxis.set_minor_formatter(plain)
    bottom.set_ylabel("time to first token (ms)\n(^ cut mid-stream, red line: failed)")
    bottom.set_xlabel("time since the traffic started (s)")

    for axis in (top, bottom):
        for i, (label, start, stop) in enumerate(phases):
            if i % 2:
                axis.axvspan(start - t0, stop - t0, color="grey", alpha=0.08, linewidth=0)
            if axis is top:
                axis.text(start - t0 + 0.2, 1.02, label, transform=axis.get_xaxis_transform(), fontsize=8)
        for i, (label, at) in enumerate(events):
            axis.axvline(at - t0, color="black", linestyle="--", linewidth=0.8)
            if axis is bottom:  # labels staggered: two events can be a moment apart
                y = 0.97 - 0.07 * (i % 3)
                axis.text(at - t0 + 0.2, y, label, transform=axis.get_xaxis_transform(), fontsize=8, va="top")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def min_start(attempts: Sequence[Attempt], region: str) -> float:
    return min(a.started for a in attempts if a.region == region)
