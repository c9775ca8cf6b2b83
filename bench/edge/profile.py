"""Where an edge's CPU goes under ``bench edge``'s stream load: py-spy samples the edge while
``--concurrency`` streams run through it to a pacer, and the report lists the functions that hold the most
samples, by their own time and with what they call.

    .venv/bin/python -m bench.edge.profile --concurrency 50 --streams 2000 [--out DIR]

The raw stacks (``edge.stacks``, py-spy's collapsed form, one stack and its count a line) stay in the output
folder for a flame graph (``flamegraph.pl``, speedscope). py-spy samples only threads that run, so the shares
are of the edge's CPU, not of its wall time. The load is ``bench edge``'s: the same request, pacer and client.

The report starts with the edge's CPU per stream split two ways.

- By part: each stage of the journey (a stage's samples are those with its function on the stack; a
  suspended stage is on no stack, so what it waits for is not counted), the journey around its stages, the
  region's answers as they arrive (the socket's callback that relays each event) and the rest (aiohttp's
  server, the event loop in C, background work).
- By feature: what each thing the edge keeps on costs (keys, limits, the ledger, the cache, routing,
  metrics, logging), a sample counted for the feature whose code is nearest its leaf, and the proxy itself
  for the rest. TLS is not among them (its work is in C, under the proxy's frames): ``bench edge --tls``
  runs an edge with TLS beside one without it.

A sample in a system call counts for the function that made it, so the shares are of user and system time.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench import peers
from bench.edge.request import chat_body, session_for
from bench.edge.run import _drive
from edge.pipeline import Pipeline
from edge.stages import default_pipeline

_LOCATION = re.compile(r"^(?P<function>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """``function (path/to/file.py:12)`` -> ``function (to/file.py)``: lines merged, the path shortened."""
    match = _LOCATION.match(frame)
    if match is None:
        return frame
    parts = match["file"].split("/")
    tail = (
        "/".join(parts[-2:])
        if "site-packages" not in parts
        else "/".join(parts[parts.index("site-packages") + 1 :])
    )
    return f"{match['function']} ({tail})"


Sample = tuple[list[str], int]  # one stack's frames (root first, named by frame_name) and its count


def samples(stacks: list[str]) -> list[Sample]:
    """py-spy's collapsed lines (``frame;frame;... count``) read once; a line that is not one is skipped."""
    out = []
    for line in stacks:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [frame_name(f) for f in stack.split(";") if f]
        if frames:
            out.append((frames, int(count_text)))
    return out


def tally(read: list[Sample]) -> tuple[Counter, Counter, int]:
    """Samples per function: where the sample was (own), anywhere on its stack (inclusive); the total."""
    own: Counter = Counter()
    inclusive: Counter = Counter()
    total = 0
    for frames, count in read:
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return own, inclusive, total


# The journey's own frames around its stages, from its arrival to its last byte.
JOURNEY = frozenset(
    {
        "_proxy (edge/app.py)",
        "run_journey (edge/pipeline.py)",
        "_run_stoppable (edge/pipeline.py)",
        "_run_stages (edge/pipeline.py)",
        "_close (edge/pipeline.py)",
        "_clean_up (edge/pipeline.py)",
    }
)
UPSTREAM_READS = "H1Connection.data_received (edge/h1.py)"  # the region's bytes, relayed as they arrive
OUTSIDE = "the journey outside its stages"
READS = "the region's answers as they arrive"
REST = "aiohttp's server, the event loop, the rest"


def stage_frames(pipeline: Pipeline) -> list[tuple[str, str]]:
    """Each stage's name and its function as the stacks name it, in the journey's order."""
    frames = []
    for stage in (*pipeline.stages, *pipeline.closing):
        where = "/".join(Path(stage.run.__code__.co_filename).parts[-2:])
        frames.append((stage.name, f"{stage.run.__qualname__} ({where})"))
    return frames


def by_part(read: list[Sample], stages: list[tuple[str, str]]) -> list[tuple[str, float]]:
    """Each part's share of the samples: the stages, the journey outside them, the region's answers as
    they arrive, and the rest. A sample is the part of the frame nearest its leaf that names one: py-spy
    reading a running process may cut a stack short at its root, never at its leaf."""
    part_of = {frame: f"stage {name}" for name, frame in stages}
    part_of |= {frame: OUTSIDE for frame in JOURNEY}
    part_of[UPSTREAM_READS] = READS
    names = [f"stage {name}" for name, _ in stages] + [OUTSIDE, READS, REST]
    return _shares(read, part_of.get, names, REST)


def _shares(
    read: list[Sample], part_of: Callable[[str], str | None], names: list[str], rest: str
) -> list[tuple[str, float]]:
    """Each of ``names``' share of the samples: a sample is the part of the frame nearest its leaf that
    ``part_of`` names, else ``rest``."""
    counts: Counter = Counter()
    for frames, count in read:
        counts[next((part for f in reversed(frames) if (part := part_of(f)) is not None), rest)] += count
    total = sum(counts.values())
    if total == 0:
        return []
    return [(name, counts[name] / total) for name in names]


# What each feature the edge keeps on costs: a sample is the feature of the frame nearest its leaf whose file
# is one of the feature's (a counter bumped inside the admit stage is the metrics', a ledger commit run by
# the loop is the ledger's). The files are matched as frame_name writes them: the last two path parts.
FEATURES: dict[str, tuple[str, ...]] = {
    "keys (API-key auth)": (
        "edge/keys.py",
        "edge/key_backend.py",
        "edge/keys_pg.py",
        "stages/authenticate.py",
    ),
    "limits (RPM/TPM, budgets, a key's share)": (
        "edge/limits.py",
        "edge/limits_memory.py",
        "edge/limits_redis.py",
        "edge/admission.py",
        "edge/spend_budget.py",
        "edge/key_share.py",
        "edge/pool_gate.py",
        "stages/admit.py",
        "stages/gate.py",
    ),
    "ledger (usage records, billing)": (
        "edge/ledger.py",
        "edge/ledger_spool.py",
        "edge/ledger_pg.py",
        "edge/billing.py",
        "edge/usage_audit.py",
        "edge/token_count.py",
        "stages/settle.py",
    ),
    "cache (response cache)": ("cache/", "diskcache/", "edge/cache_", "stages/cache.py", "stages/store.py"),
    "routing (GeoIP, the router)": (
        "geo/",
        "geoip2/",
        "maxminddb/",
        "edge/client_route.py",
        "stages/route.py",
    ),
    "metrics (Prometheus)": ("prometheus_client/", "edge/metrics.py", "edge/metric_labels.py"),
    "logging": ("logging/", "edge/request_log.py"),
}
UNFEATURED = "the proxy itself (parse, forward, relay, aiohttp, the loop)"
_FILE = re.compile(r"\((?P<file>[^()]+)\)$")


@functools.cache
def feature_of(frame: str) -> str | None:
    """The feature whose file ``frame`` (as frame_name names it) is in, if any."""
    match = _FILE.search(frame)
    if match is None:
        return None
    file = match["file"]
    return next((name for name, files in FEATURES.items() if file.startswith(files)), None)


def by_feature(read: list[Sample]) -> list[tuple[str, float]]:
    """Each feature's share of the samples, and the rest's (the proxy without them)."""
    return _shares(read, feature_of, [*FEATURES, UNFEATURED], UNFEATURED)


def print_parts(title: str, parts: list[tuple[str, float]], cpu_ms: float) -> None:
    print(f"{title} (share of the samples, and of the CPU per stream):")
    for name, share in parts:
        print(f"  {100 * share:5.1f}%  {share * cpu_ms:6.3f} ms  {name}")


def print_table(title: str, counts: Counter, total: int, top: int) -> None:
    print(f"{title}:")
    for name, count in counts.most_common(top):
        print(f"  {100 * count / total:5.1f}%  {name}")


def _py_spy() -> str:
    beside = Path(sys.executable).with_name("py-spy")  # the project's environment has it
    return str(beside) if beside.exists() else "py-spy"


async def _load(edge: peers.Endpoint, concurrency: int, streams: int, tokens: int) -> None:
    body = chat_body(tokens)
    async with session_for(edge) as session:
        await _drive(session, edge, body, tokens, concurrency, streams, deadline_s=600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.edge.profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--concurrency", type=int, default=50, help="streams at once (default 50)")
    parser.add_argument("--streams", type=int, default=2000, help="streams sampled (default 2000)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per stream (default 16)")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="the pacer's gap (default 20)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default 250)")
    parser.add_argument(
        "--native", action="store_true", help="also sample C frames (uvloop, the kernel's calls)"
    )
    parser.add_argument("--top", type=int, default=40, help="functions listed per table (default 40)")
    parser.add_argument("--out", default="", help="folder for the logs and stacks (default: a temp folder)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="nearshore-edge-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    stacks = out / "edge.stacks"
    pacer = peers.start_stand_in(out, "pacer", "pacer", tokens=args.tokens, interval_ms=args.interval_ms)
    try:
        edge = peers.start_edge(out, "edge", pacer.url, tls=False)
        try:
            # One unsampled wave opens the connections, as in bench edge.
            asyncio.run(_load(edge, args.concurrency, args.concurrency, args.tokens))
            assert edge.process is not None and edge.process.proc is not None
            pid = str(edge.process.proc.pid)
            spy_argv = [_py_spy(), "record", "--pid", pid, "--subprocesses", "--rate", str(args.rate)]
            spy_argv += ["--format", "raw", "--output", str(stacks)]
            spy_argv += ["--native"] if args.native else ["--nonblocking"]
            spy = subprocess.Popen(
                spy_argv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            cpu0 = edge.cpu_s()
            asyncio.run(_load(edge, args.concurrency, args.streams, args.tokens))
            cpu_ms = (edge.cpu_s() - cpu0) * 1000 / args.streams
            spy.send_signal(2)  # py-spy writes its stacks on SIGINT
            _, err = spy.communicate(timeout=60)
        finally:
            edge.stop()
    finally:
        pacer.stop()
    if not stacks.exists():
        print(f"py-spy wrote nothing: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
        return 1
    read = samples(stacks.read_text().splitlines())
    own, inclusive, total = tally(read)
    print(
        f"edge CPU per stream {cpu_ms:.2f} ms ({args.streams} streams at {args.concurrency}); {total} samples"
    )
    print_parts("by part", by_part(read, stage_frames(default_pipeline())), cpu_ms)
    print_parts("by feature", by_feature(read), cpu_ms)
    print_table("own time", own, total, args.top)
    print_table("inclusive time", inclusive, total, args.top)
    print(f"stacks: {stacks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
