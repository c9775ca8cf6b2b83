"""The ``nearshore`` command: one table of subcommands, each a module with an argument adder and a runner.

The command modules (this package) sit above every layer (ARCHITECTURE.md, "Layers"): they may import
anything, and nothing imports them, so the base package ``nearshore`` stays below all the rest. Building
the parser imports each command module; a command that needs a heavy service (the region's llama.cpp)
imports it in its runner.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from dataclasses import dataclass

from nearshore import logsafe
from nearshore.config import ConfigError
from nearshore.listen import BindError
from nearshore.log_writer import BackgroundStreamHandler


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    help: str
    description: str
    add: str = "add_arguments"
    run: str = "main"


COMMANDS = [
    Command(
        "region",
        "cli.serve",
        "run a regional serving node (OpenAI-compatible API over llama.cpp)",
        "Serve the configured model (the embedded Gemma 3 270M by default) over an OpenAI-compatible HTTP "
        "API with continuous batching.",
        run="run_region",
    ),
    Command(
        "edge",
        "cli.serve",
        "run an edge proxy (TLS, API keys, rate limits, streaming relay, billing)",
        "Serve users near them: authenticate, validate, rate-limit and meter each request, and "
        "relay it over warm connections to the configured regions, failing over before the first byte.",
        add="add_edge_arguments",
        run="run_edge",
    ),
    Command(
        "keys",
        "cli.keys",
        "create, list and revoke API keys",
        "API keys, stored hashed in SQLite.",
        add="add_keys_arguments",
        run="run_keys",
    ),
    Command(
        "usage",
        "cli.keys",
        "usage and cost per key and day",
        "A report from the edge's ledger.",
        add="add_usage_arguments",
        run="run_usage",
    ),
    Command(
        "ca",
        "cli.ca",
        "a cluster CA and certificates for mutual TLS between edges and regions",
        "Create the cluster CA and issue server and client certificates.",
        run="run",
    ),
    Command(
        "up",
        "cli.up",
        "bring a topology up: regions, emulated links, edge (Ctrl-C stops it all)",
        "Start every process of a topology behind emulated links, readiness-checked, and print the URL, an "
        "API key and examples. Ctrl-C stops everything.",
    ),
    Command(
        "chat",
        "cli.chat",
        "stream an answer through the running topology's edge, as its user would",
        "Ask the topology started by `nearshore up`, through the user's emulated last mile.",
    ),
    Command(
        "scenario",
        "cli.scenario",
        "run a latency scenario on a fresh topology (table + PNG chart)",
        "Bring a topology up, run the scenario, print its table and write its chart.",
    ),
    Command(
        "link",
        "cli.link",
        "run emulated links (userspace TCP proxies with delay, jitter, loss, rate, faults)",
        "Run one or more emulated links in this process, with an HTTP control API.",
    ),
    Command(
        "fidelity",
        "cli.fidelity",
        "check that emulated links deliver their profiles' delay and rate",
        "Measure RTT and bandwidth through a userspace link built from each profile (all by default): "
        "RTT p50 within 2 ms or 3%, rate within 5%.",
    ),
    Command(
        "pacer",
        "cli.pacer",
        "a stand-in region that streams tokens at a fixed pace (benchmarks, tests)",
        "Speak the regional node's API without a model: fixed token count and pace, optionally failing or "
        "breaking streams on purpose.",
    ),
    Command(
        "hostile",
        "harness.standins.hostile",
        "a stand-in region that misbehaves on purpose, by mode (tests of the edge's defences)",
        "Speak the regional node's API shape on raw HTTP and answer as a faulty or hostile region or "
        "provider would: endless bodies, lying usage, broken framing, HTML, hangs, 429s with Retry-After, "
        "5xx, resets, stalls, cut streams, context-length and content-filter 400s. A request picks a mode "
        "with the body's user field (mode:<name>[:arg...], or per instance mode:a=503,*=ok); --mode sets "
        "the default.",
    ),
    Command(
        "cache-eval",
        "cli.cache",
        "measure the response cache on labelled pairs: paraphrase hits, false hits, the setting's curve",
        "For each pair of a JSON Lines file ({a, b, same, kind}), store an answer for a in a fresh cache "
        "with the shipped settings and look up b; report the paraphrase hit rate, the false-hit rate with "
        "its 95% interval, per kind, and the curve over the target false-hit rate.",
        add="add_eval_arguments",
        run="run_eval",
    ),
    Command(
        "cache",
        "cli.cache",
        "an edge's response cache: stats, clear, inspect",
        "Look into an edge's cache folder (from its config, or --folder): counts, sizes and ages; clear "
        "all, a partition or old entries; show entries. Tenants are shown only with --show-tenants.",
        add="add_cache_arguments",
        run="run_cache",
    ),
    Command(
        "gpu-check",
        "cli.gpu_check",
        "the torch engine on this machine's GPU: kernels, parity, cross-talk, decode vs the bandwidth floor",
        "Check the CUDA kernels against the torch reference, teacher-forced parity with llama.cpp and no "
        "cross-talk between batched streams; time decode steps at several batch sizes (CUDA graphs on and "
        "off) against the memory-bandwidth floor and beside llama.cpp's rate. Installs nothing; without a "
        "GPU, --device cpu runs the same checks slowly.",
    ),
    Command(
        "demo",
        "cli.demo",
        "the main job: bring up the Lagos topology, stream one answer as a Lagos user, stop",
        "Start regions, emulated links and the edge, stream an answer through them as the "
        "Lagos user would, print where the time went, and stop everything.",
    ),
]
BENCHMARKS = [
    Command(
        "region",
        "cli.bench",
        "streaming load on a regional node vs llama-cpp-python's own server",
        "Drive N concurrent streaming requests at a regional node and at llama-cpp-python's OpenAI server on "
        "the same model, threads and prompts; report TTFT, inter-token latency and tokens/s side by side.",
        add="add_region_arguments",
        run="run_region",
    ),
    Command(
        "faults",
        "cli.bench",
        "provider faults (429, 5xx, resets, stalls, cut streams, 400s) through the edge, beside LiteLLM",
        "Three `nearshore hostile` replicas (two of the model, one of its fallback) behind the edge and, "
        "with --litellm, behind LiteLLM's proxy configured alike; each fault sent a few times, streamed and "
        "not; every answer rescued, advisory or failed; median time to answer and attempts per replica.",
        add="add_faults_arguments",
        run="run_faults",
    ),
    Command(
        "fairness",
        "cli.bench",
        "one key flooding long prompts (or echo scoring) beside another key's short chat",
        "A real edge over a real region on the embedded model: the victim key's TTFT p50/p95 unloaded and "
        "while a flood key keeps long prompts (or echo + logprobs=20 completions) in flight, and the ratio.",
        add="add_fairness_arguments",
        run="run_fairness",
    ),
    Command(
        "region-rss",
        "cli.bench",
        "a region's memory over many scoring (echo + logprobs) requests",
        "A real region on the embedded model answers --requests completions with echo and logprobs=20 (or "
        "short chats); its VmRSS every --every requests, the growth in all and per request in the second "
        "half.",
        add="add_region_rss_arguments",
        run="run_region_rss",
    ),
    Command(
        "keys",
        "cli.bench",
        "how fast a city's edges see a key created or revoked: PostgreSQL beside the SQLite file",
        "Edges over one stand-in region with their keys in a real PostgreSQL (pushed) and in one SQLite file "
        "(polled): time until every edge accepts a new key and ends a revoked key's open stream, p50/p99, "
        "and a short chat's latency in each mode.",
        add="add_keys_arguments",
        run="run_keys",
    ),
    Command(
        "hostile",
        "cli.bench",
        "what a hostile region costs the edge, beside an honest one",
        "Closed-loop load through an edge in front of `nearshore hostile` (every mode at once) and one in "
        "front of the pacer: /health latency, peak RSS, statuses, and one ledger row per request.",
        add="add_hostile_arguments",
        run="run_hostile",
    ),
    Command(
        "edge",
        "cli.bench",
        "what the edge adds, beside nginx and LiteLLM's proxy",
        "Time to first token, end-to-end time and CPU per stream through the edge, nginx and LiteLLM in "
        "front of a fixed-pace upstream, minus the direct path; and the most requests per second.",
        add="add_edge_arguments",
        run="run_edge",
    ),
    Command(
        "geo",
        "cli.bench",
        "the route stage's time per request: GeoIP lookup and routing decision, 3 to 100 regions",
        "Time client_address + locate (the GeoIP LRU warm and cold) and the routing decision (prefix "
        "chain + Router.route) per request, p50/p99 in microseconds, over made-up catalogs of real cities "
        "(3, 10 and 100 regions), clients and prompts with and without long shared prefixes.",
        add="add_geo_arguments",
        run="run_geo",
    ),
    Command(
        "grammar",
        "cli.bench",
        "constrained decoding: each grammar engine's compile time and mask time per token",
        "For llguidance (the engines' grammar engine) and, when importable, xgrammar and outlines-core: "
        "compile eight JSON schemas against the embedded model's vocabulary and walk a valid document of "
        "each, timing every token's mask and advance.",
        add="add_grammar_arguments",
        run="run_grammar",
    ),
    Command(
        "cache",
        "cli.bench",
        "the response cache: lookup latency at 1k-1M entries, the vector index, TTFT of a hit",
        "Semantic lookup p50/p99 (embedding included) with 1k, 100k and 1M entries in one partition and over "
        "many small ones; numpy brute force, the store's IVF index, hnswlib, usearch and faiss side by side; "
        "memory and disk per entry; TTFT of a hit through an edge against a miss and against no cache.",
        add="add_cache_arguments",
        run="run_cache",
    ),
    Command(
        "load",
        "cli.bench",
        "load any OpenAI-compatible endpoint: rate sweeps, goodput, tails, caches, cost, soak",
        "Open-loop arrivals (Poisson or bursty gamma) at a rate or a sweep, or a closed loop, with a prompt "
        "mix that exercises prefix and response caches; TTFT, ITL, TPOT and e2e tails, throughput, goodput "
        "under an SLO, cache hits, refusals, errors and cost, one or two endpoints side by side; a table, "
        "JSON and PNG charts, the generator's own ceiling beside them; --soak samples memory and fds.",
        add="add_load_arguments",
        run="run_load",
    ),
]


def _add(subparsers: argparse._SubParsersAction, command: Command, chosen: str | None) -> None:
    """The command's parser; its module is imported (and its arguments added) only where it may run: every
    command when none was chosen yet (the whole parser), else the chosen one alone."""
    parser = subparsers.add_parser(command.name, help=command.help, description=command.description)
    if chosen in (None, command.name):
        module = importlib.import_module(command.module)
        getattr(module, command.add)(parser)
        parser.set_defaults(run=getattr(module, command.run))


class OneLineParser(argparse.ArgumentParser):
    """A parser whose errors are one line, naming the command (its usage is one ``--help`` away); its
    subcommands' parsers are of this class too (argparse makes them of the parent's)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def chosen_commands(argv: list[str]) -> tuple[str, str | None]:
    """The command and benchmark named in argv (the first words that are not options), or "" where none is:
    a process started for one command imports that command's module alone (a start costs a third less
    CPU), where the whole parser would import every command's."""
    words = [word for word in argv if not word.startswith("-")]
    command = words[0] if words else ""
    return command, (words[1] if command == "bench" and len(words) > 1 else None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with argv the parser that argv needs: every command listed with its help, the
    arguments of the one it names."""
    command, benchmark = chosen_commands(argv) if argv is not None else (None, None)
    parser = OneLineParser(
        prog="nearshore",
        description="Edge-aware, geo-distributed LLM serving: edge proxies, regional nodes, "
        "latency emulation.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for entry in COMMANDS:
        _add(commands, entry, command)
    bench = commands.add_parser(
        "bench",
        help="benchmarks, side by side with peers",
        description="Benchmarks that compare side by side in one run.",
    )
    benches = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for entry in BENCHMARKS:
        _add(benches, entry, benchmark if command in (None, "bench") else "")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    if not logging.getLogger().handlers:  # (as basicConfig: a caller's own logging, a test's, stays)
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            handlers=[BackgroundStreamHandler(sys.stderr)],  # a stalled log reader must not stall the loop
        )
    logsafe.install()  # no secret reaches a log line, whoever logs it
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"nearshore: config error: {exc}", file=sys.stderr)
        return 2
    except BindError as exc:  # a port that cannot be taken: one line, whichever command listens
        print(f"nearshore {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
