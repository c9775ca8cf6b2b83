"""``nearshore bench edge|region|hostile|faults|fairness|keys|geo|cache|load``: the benchmarks' flags; each
run lives in bench/ (geo's in bench/geo/route.py, cache's in bench/cache/lookup.py with its TTFT part in
bench/)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from bench import fairness, hostile, keys_fleet, region, region_rss
from bench.cache import lookup as bench_cache
from bench.cache import ttft as cache_ttft
from bench.edge import routing as edge_routing
from bench.edge import run as edge
from bench.faults import run as faults
from bench.geo import route as bench_route
from bench.load import run as load_run
from cache.embedder import load_embedder

T = TypeVar("T")


def _settings(args: argparse.Namespace, schema: type[T]) -> T:
    """The flags a benchmark's settings class names, taken from the parsed command line."""
    names = [f.name for f in dataclasses.fields(schema)]  # type: ignore[arg-type]
    values: dict[str, Any] = {name: getattr(args, name) for name in names}
    return schema(**values)


# --- bench edge ----------------------------------------------------------------------------------------


def routing(text: str) -> str:
    edge_routing.parse_modes(text)  # argparse turns its ValueError into a usage error
    return text


def add_edge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", default="1,10,50,200", help="stream counts (default 1,10,50,200)")
    parser.add_argument(
        "--streams", type=int, default=200, help="measured streams per path and level (default 200)"
    )
    parser.add_argument(
        "--waves", type=int, default=4, help="at least this many streams per worker and level (default 4)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds per level, paths interleaved (default 2)"
    )
    parser.add_argument("--tokens", type=int, default=16, help="tokens per stream (default 16)")
    parser.add_argument(
        "--interval-ms", type=float, default=20.0, help="the pacer's gap between tokens (default 20)"
    )
    parser.add_argument(
        "--clock",
        choices=["stream", "step"],
        default="stream",
        help="the pacer's clock: each stream's own from its arrival (default), or one step clock for every "
        "stream, as a region's batched decoder emits tokens (concurrent streams' events arrive together)",
    )
    parser.add_argument("--no-nginx", action="store_true", help="skip nginx")
    parser.add_argument(
        "--nginx", default="", help="nginx binary (default: nginx on PATH, else /usr/sbin/nginx)"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also a bare byte relay in Python on uvloop (bench/edge/floor.py), the runtime's own cost, and "
        "the edge's frame without its stages (bench/edge/frame.py: aiohttp, the pool, the SSE relay), and "
        "that frame on the lean HTTP/1.1 server core (bench/edge/frame_lean.py)",
    )
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's proxy")
    parser.add_argument(
        "--litellm",
        default=".venv-litellm/bin/litellm",
        help="LiteLLM's CLI, in its own venv (default %(default)s)",
    )
    parser.add_argument(
        "--rps-rates",
        default="100,200,300,400,500,600,800,1000,1200,1600",
        help="request rates to ramp through for the max-RPS part; empty to skip it",
    )
    parser.add_argument("--rps-seconds", type=float, default=2.0, help="seconds at each rate (default 2)")
    parser.add_argument(
        "--rps-budget-s", type=float, default=60.0, help="cap on the ramp's time (default 60)"
    )
    parser.add_argument(
        "--unary-concurrency", type=int, default=50, help="clients of the non-streamed part (default 50)"
    )
    parser.add_argument(
        "--unary-seconds",
        type=float,
        default=10.0,
        help="non-streamed part, per path; 0 skips it (default 10)",
    )
    parser.add_argument(
        "--routing",
        default="on",
        type=routing,
        help="the edge's route stage: on, off, or on,off to run both and report what routing adds "
        "(default on)",
    )
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="also an edge in fleet mode (keys and ledger in PostgreSQL, limits and cache through Redis, "
        "both started for the run) beside the edge alone, and what it adds",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="also the edge with TLS on (its default) beside the edge with it off, and what TLS adds",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every number as JSON")
    parser.add_argument(
        "--logs", default="", help="folder for process logs and configs (default: a temp folder)"
    )


def run_edge(args: argparse.Namespace) -> int:
    edge.run(_settings(args, edge.EdgeBench))
    return 0


# --- bench region --------------------------------------------------------------------------------------


def add_region_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency", default="1,4,16", help="comma-separated stream counts (default 1,4,16)"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per stream (default 64)")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 2, help="llama.cpp threads, both servers"
    )
    parser.add_argument("--model-path", default="", help="GGUF file (default: the embedded model)")
    parser.add_argument("--no-peer", action="store_true", help="skip llama-cpp-python's server")
    parser.add_argument(
        "--engine",
        choices=["llama.cpp", "gpu"],
        default="llama.cpp",
        help="gpu: also the torch engine (CUDA when present, else the CPU), beside the llama.cpp engine",
    )
    parser.add_argument(
        "--schema",
        action="store_true",
        help="also run every level constrained to a JSON schema (guided_json), beside the same unconstrained",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each level per server (with --schema, the two modes alternate: ABBA)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--logs", default="", help="folder for server logs (default: a temp folder)")


def run_region(args: argparse.Namespace) -> int:
    region.run(_settings(args, region.RegionBench))
    return 0


# --- bench region-rss ----------------------------------------------------------------------------------


def add_region_rss_arguments(parser: argparse.ArgumentParser) -> None:
    region_rss.add_arguments(parser)


def run_region_rss(args: argparse.Namespace) -> int:
    return region_rss.run_and_print(args)


# --- bench hostile -------------------------------------------------------------------------------------


def add_hostile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=20.0, help="load per edge (default 20)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight (default 32)")
    parser.add_argument("--logs", default="", help="folder for logs and configs (default: a temp folder)")


def run_hostile(args: argparse.Namespace) -> int:
    hostile.run(_settings(args, hostile.HostileBench))
    return 0


# --- bench faults ------------------------------------------------------------------------------------


def add_faults_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--litellm",
        default="",
        metavar="PATH",
        help="also through LiteLLM's proxy: its `litellm` executable, in its own venv (default: ours alone)",
    )
    parser.add_argument("--cases", default="all", help="comma-separated case names (default all)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="answers per case and kind, sent at once (default 3)"
    )
    parser.add_argument("--logs", default="", help="folder for logs and configs (default: a temp folder)")


def run_faults(args: argparse.Namespace) -> int:
    try:
        faults.run(_settings(args, faults.FaultsBench))
    except ValueError as exc:
        print(f"nearshore bench faults: {exc}", file=sys.stderr)
        return 2
    return 0


# --- bench fairness ------------------------------------------------------------------------------------


def add_fairness_arguments(parser: argparse.ArgumentParser) -> None:
    fairness.add_arguments(parser)


def run_fairness(args: argparse.Namespace) -> int:
    fairness.run_and_print(fairness.from_args(args))
    return 0


# --- bench keys ----------------------------------------------------------------------------------------


def add_keys_arguments(parser: argparse.ArgumentParser) -> None:
    keys_fleet.add_arguments(parser)


def run_keys(args: argparse.Namespace) -> int:
    keys_fleet.run_and_print(keys_fleet.from_args(args))
    return 0


# --- bench geo -----------------------------------------------------------------------------------------


def add_geo_arguments(parser: argparse.ArgumentParser) -> None:
    bench_route.add_arguments(parser)
    parser.add_argument("--json", metavar="FILE", help="also write every number as JSON")


def run_geo(args: argparse.Namespace) -> int:
    report = bench_route.run_from_args(args)
    print(bench_route.format_report(report))
    if args.json:
        Path(args.json).write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2))
    return 0


# --- bench grammar -------------------------------------------------------------------------------------


def add_grammar_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="", help="GGUF file whose vocabulary to use (default: embedded)")
    parser.add_argument("--repeats", type=int, default=3, help="walks per schema and engine")
    parser.add_argument("--json", metavar="FILE", help="also write every number as JSON")


def run_grammar(args: argparse.Namespace) -> int:
    from bench import grammar
    from regional.model_store import resolve_model_path

    rows = grammar.run(str(resolve_model_path(args.model)), args.repeats)
    print(grammar.table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


# --- bench cache ---------------------------------------------------------------------------------------


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes", default="1000,100000,1000000", help="rows in one partition (default 1000,100000,1000000)"
    )
    parser.add_argument("--queries", type=int, default=200, help="lookups timed per size (default 200)")
    parser.add_argument(
        "--small-partitions", type=int, default=10_000, help="partitions of the many-tenants case; 0 skips it"
    )
    parser.add_argument("--rows-per-partition", type=int, default=10, help="rows in each (default 10)")
    parser.add_argument(
        "--peers", default="hnswlib,usearch,faiss", help="indexes compared with the store's, where installed"
    )
    parser.add_argument(
        "--peer-sizes",
        default="100000",
        help="rows the indexes are compared at; empty skips (default 100000)",
    )
    parser.add_argument(
        "--work-dir",
        default="/tmp/nearshore-bench-cache",
        help="filled folders and built indexes, kept for later runs (default %(default)s)",
    )
    parser.add_argument("--budget-s", type=float, default=1800.0, help="stop starting new parts after this")
    parser.add_argument("--fresh", action="store_true", help="refill the folders a previous run left")
    parser.add_argument(
        "--ttft-rows",
        type=int,
        default=100_000,
        help="the filled size the edge's TTFT is measured on (one of --sizes); 0 skips it (default 100000)",
    )
    parser.add_argument("--ttft-requests", type=int, default=100, help="streams per kind (default 100)")
    parser.add_argument(
        "--rtt-ms", type=float, default=100.0, help="the region's first byte: Lagos-London (default 100)"
    )
    parser.add_argument(
        "--no-audit",
        action="store_true",
        help="the cache's edges audit no semantic hit (to see the live audit's share of a miss's cost)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every number as JSON")
    parser.add_argument("--logs", default="", help="folder for process logs (default: a temp folder)")


def run_cache(args: argparse.Namespace) -> int:
    report = bench_cache.run(_settings(args, bench_cache.CacheBench))
    if args.ttft_rows:
        folder = Path(args.work_dir) / f"rows-{args.ttft_rows}"
        if not (folder / "filled.json").exists():
            print(f"bench cache: no filled folder of {args.ttft_rows} rows (add it to --sizes); TTFT skipped")
        else:
            corpus = bench_cache.load_corpus(load_embedder())
            print(
                f"bench cache: TTFT through an edge, {args.ttft_rows} rows, "
                f"region's first byte {args.rtt_ms} ms"
            )
            ttft = cache_ttft.TtftBench(
                folder,
                args.ttft_rows,
                corpus.stored,
                bench_cache.answered_paraphrases(corpus),
                requests=args.ttft_requests,
                rtt_ms=args.rtt_ms,
                logs=args.logs,
                audit=not args.no_audit,
                judged=bench_cache.answered_paraphrases(corpus, judged=True),
            )
            report["ttft"] = cache_ttft.run(ttft)
    print(bench_cache.format_report(report))
    if args.json:
        Path(args.json).write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2))
    return 0


# --- bench load ----------------------------------------------------------------------------------------


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("endpoints")
    target.add_argument(
        "--url", action="append", default=[], help="an OpenAI-compatible base URL; twice: side by side"
    )
    target.add_argument(
        "--api-key", action="append", default=[], help="its key (once for all, or once per --url)"
    )
    target.add_argument("--model", default="gemma-3-270m", help="model asked for (default %(default)s)")
    target.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    target.add_argument(
        "--ca",
        action="append",
        default=[],
        help="CA file to trust (e.g. the edge's dev-cert.pem); once for all, or once per --url",
    )
    target.add_argument("--client-cert", default="", help="a client certificate (mutual TLS to a region)")
    target.add_argument("--client-key", default="", help="its key")
    target.add_argument(
        "--up",
        action="append",
        default=[],
        metavar="TARGET",
        help="the running `nearshore up` topology: edge (as its user reaches it) or a region's name (its "
        "direct path); repeatable",
    )
    target.add_argument("--up-state", default="", help="that topology's state.json (default: the latest)")
    target.add_argument("--timeout-s", type=float, default=300.0, help="one request's limit (default 300)")
    load = parser.add_argument_group("load")
    load.add_argument("--rate", type=float, default=0.0, help="open loop: requests per second")
    load.add_argument("--rates", default="", help="open-loop sweep, e.g. 1,2,4,8 (requests per second)")
    load.add_argument(
        "--burstiness", type=float, default=1.0, help="gamma arrivals: 1 Poisson, >1 bursty (default 1)"
    )
    load.add_argument(
        "--concurrency", default="", help="closed loop: requests in flight per endpoint, e.g. 8 or 1,4,16"
    )
    load.add_argument("--seconds", type=float, default=10.0, help="each step's length (default 10)")
    load.add_argument(
        "--seed",
        type=int,
        default=None,
        help="arrivals and prompts (default: a new one each run, printed; a rerun of the same seed finds "
        "its questions in the edge's response cache)",
    )
    mix = parser.add_argument_group("prompt mix")
    mix.add_argument("--system-prompts", type=int, default=4, help="shared system prompts (default 4)")
    mix.add_argument("--system-tokens", type=int, default=64, help="their length (default 64)")
    mix.add_argument("--repeat-share", type=float, default=0.1, help="repeated questions (default 0.1)")
    mix.add_argument(
        "--paraphrase-share", type=float, default=0.1, help="paraphrased questions (default 0.1)"
    )
    mix.add_argument(
        "--input-tokens",
        default="uniform:32-128",
        help="context length: fixed:N, uniform:LO-HI, lognormal:MEAN[:SIGMA] (default %(default)s)",
    )
    mix.add_argument(
        "--output-tokens", default="fixed:32", help="max_tokens, same forms (default %(default)s)"
    )
    mix.add_argument("--temperature", type=float, default=0.0, help="default 0 (the edge caches only 0)")
    report = parser.add_argument_group("report")
    report.add_argument(
        "--slo", default="ttft=500ms,itl=100ms", help="goodput's objectives: ttft, itl, tpot, e2e"
    )
    report.add_argument("--prices", default="", help="an edge config whose [prices] give the cost")
    report.add_argument("--json", metavar="FILE", help="also write every number as JSON")
    report.add_argument("--charts", default="", metavar="DIR", help="write PNG charts here")
    report.add_argument("--self-test", action="store_true", help="only measure the generator's own ceiling")
    report.add_argument(
        "--ceiling-s", type=float, default=2.0, help="ceiling measured before each run; 0 skips"
    )
    report.add_argument("--logs", default="", help="folder for the self-test server's log")
    soak = parser.add_argument_group("soak")
    soak.add_argument("--soak", default="", help="one open-loop step this long (30m, 2h) at --rate")
    soak.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples (default 10)")
    soak.add_argument("--pid", action="append", default=[], help="a watched process: NAME=PID (repeatable)")
    soak.add_argument(
        "--pids-from", default="", help="watch a topology's processes: its run folder or state.json"
    )


def run_load(args: argparse.Namespace) -> int:
    try:
        load_run.run(_settings(args, load_run.LoadBench))
    except ValueError as exc:
        print(f"nearshore bench load: {exc}", file=sys.stderr)
        return 2
    return 0
