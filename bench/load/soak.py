"""A soak's other half: the memory and open file descriptors of the processes under load, over time.

Every ``interval_s`` each watched process's resident set (``VmRSS`` in /proc/PID/status) and open file
descriptors (entries of /proc/PID/fd) are read. Growth is reported two ways: the mean of the last 10% of
samples minus the mean of the first 10% (a warm-up spike and a late spike both show), and the least-squares
slope per hour over all samples (steady leaks show even when short runs hide them).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)?$")


def parse_duration_s(text: str) -> float:
    """``30m`` -> 1800.0; ``90s``, ``2h``, or a bare number of seconds."""
    match = DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"a duration is NUMBER[s|m|h]: {text!r}")
    return float(match[1]) * {"s": 1, "m": 60, "h": 3600, None: 1}[match[2]]


def parse_pid(text: str) -> tuple[str, int]:
    """``edge=1234`` -> ("edge", 1234)."""
    name, _, pid = text.partition("=")
    if not name or not pid.isdigit():
        raise ValueError(f"a watched process is NAME=PID: {text!r}")
    return name, int(pid)


def pids_from_run(folder: Path) -> dict[str, int]:
    """The live processes a topology's run folder (``nearshore up``: its ``state.json``) lists, named by
    their command line (``edge``, ``region``, ``link``; repeats get ``-2``, ``-3``)."""
    state = folder / "state.json" if folder.is_dir() else folder
    pids: list[int] = json.loads(state.read_text())["pids"]
    named: dict[str, int] = {}
    for pid in pids:
        name = _command_name(pid)
        if name is None:
            continue  # gone
        unique, n = name, 1
        while unique in named:
            n += 1
            unique = f"{name}-{n}"
        named[unique] = pid
    return named


def _command_name(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    words = [w.decode(errors="replace") for w in argv if w]
    # `python -m cli edge --config ...`: the subcommand names the process
    for word in words:
        if word.startswith("--"):
            break
        if word in ("edge", "region", "link", "pacer", "hostile"):
            name = word
            if "--config" in words:  # a region's config file names it: region-london.toml
                stem = Path(words[words.index("--config") + 1]).stem
                name = stem if stem.startswith(word) else name
            return name
    return Path(words[0]).name if words else None


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class ProcessSeries:
    pid: int
    times_s: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    gone: bool = False


class Growth(msgspec.Struct):
    name: str
    pid: int
    samples: int
    rss_first_mib: float
    rss_last_mib: float
    rss_growth_mib: float
    rss_slope_mib_per_h: float
    fds_first: float
    fds_last: float
    fds_growth: float
    fds_slope_per_h: float
    exited: bool


class Sampler:
    """Samples each watched process every ``interval_s`` until stopped."""

    def __init__(self, pids: dict[str, int], interval_s: float) -> None:
        self.series = {name: ProcessSeries(pid) for name, pid in pids.items()}
        self.interval_s = interval_s

    def sample(self, now_s: float) -> None:
        for series in self.series.values():
            if series.gone:
                continue
            try:
                rss, fds = rss_mib(series.pid), open_fds(series.pid)
            except (OSError, ValueError):
                series.gone = True  # it exited (or is not ours to read): its growth ends here
                continue
            series.times_s.append(now_s)
            series.rss_mib.append(rss)
            series.fds.append(fds)

    async def run(self) -> None:
        started = time.monotonic()
        while True:
            self.sample(time.monotonic() - started)
            await asyncio.sleep(self.interval_s)

    def growth(self) -> list[Growth]:
        return [growth_of(name, s) for name, s in self.series.items()]


def growth_of(name: str, series: ProcessSeries) -> Growth:
    rss_first, rss_last = _ends(series.rss_mib)
    fds_first, fds_last = _ends([float(n) for n in series.fds])
    return Growth(
        name=name,
        pid=series.pid,
        samples=len(series.times_s),
        rss_first_mib=rss_first,
        rss_last_mib=rss_last,
        rss_growth_mib=rss_last - rss_first,
        rss_slope_mib_per_h=slope(series.times_s, series.rss_mib) * 3600,
        fds_first=fds_first,
        fds_last=fds_last,
        fds_growth=fds_last - fds_first,
        fds_slope_per_h=slope(series.times_s, [float(n) for n in series.fds]) * 3600,
        exited=series.gone,
    )


def _ends(values: list[float]) -> tuple[float, float]:
    """Means of the first and the last 10% of the values (at least one each); NaN when empty."""
    if not values:
        return float("nan"), float("nan")
    k = max(1, len(values) // 10)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs; 0 with fewer than two distinct xs."""
    n = len(xs)
    if n < 2:
        return 0.0
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    var_x = sum((x - mean_x) ** 2 for x in xs)
    if var_x == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var_x
