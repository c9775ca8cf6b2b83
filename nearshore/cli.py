"""The ``nearshore`` command."""

from __future__ import annotations

import argparse
import logging
import sys

from nearshore.config import ConfigError, load_config
from nearshore.httpkit import PortInUse


def _region(args: argparse.Namespace) -> int:
    from regional.config import RegionConfig
    from regional.node import build_region_app, run_region

    config = load_config(args.config, RegionConfig)
    try:
        app = build_region_app(config)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"{args.config or 'defaults'}: {exc}") from exc
    try:
        run_region(app, config, port=args.port)
    except PortInUse as exc:
        raise ConfigError(f"{args.config or 'defaults'}: server.port: {exc}") from None
    return 0


def _edge(args: argparse.Namespace) -> int:
    from edge.config import EdgeConfig
    from edge.node import build_edge_app, run_edge

    config = load_config(args.config, EdgeConfig)
    try:
        app = build_edge_app(config)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"{args.config or 'defaults'}: {exc}") from exc
    try:
        run_edge(app, config, port=args.port)
    except PortInUse as exc:
        raise ConfigError(f"{args.config or 'defaults'}: server.port: {exc}") from None
    return 0


def _keys(args: argparse.Namespace) -> int:
    from edge.admin_cli import run_keys

    return run_keys(args)


def _usage(args: argparse.Namespace) -> int:
    from edge.admin_cli import run_usage

    return run_usage(args)


def _ca(args: argparse.Namespace) -> int:
    from nearshore.ca_cli import run

    return run(args)


def _pacer(args: argparse.Namespace) -> int:
    from netem.pacer import main as pacer_main

    return pacer_main(args)


def _up(args: argparse.Namespace) -> int:
    from netem.up import main as up_main

    return up_main(args)


def _chat(args: argparse.Namespace) -> int:
    from netem.chat import main as chat_main

    return chat_main(args)


def _link(args: argparse.Namespace) -> int:
    from netem.link import main as link_main

    return link_main(args)


def _scenario(args: argparse.Namespace) -> int:
    from netem.scenario_cli import main as scenario_main

    return scenario_main(args)


def _demo(args: argparse.Namespace) -> int:
    from netem.demo import main as demo_main

    return demo_main(args)


def _bench_region(args: argparse.Namespace) -> int:
    from regional.bench import main as bench_main

    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nearshore",
        description="Edge-aware, geo-distributed LLM serving: edge proxies, regional nodes, "
        "latency emulation.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    region = commands.add_parser(
        "region",
        help="run a regional serving node (OpenAI-compatible API over llama.cpp)",
        description="Serve the configured model (the embedded Gemma 3 270M by default) over an "
        "OpenAI-compatible HTTP API with continuous batching.",
    )
    region.add_argument("--config", metavar="FILE", help="region TOML file (default: built-in defaults)")
    region.add_argument("--port", type=int, help="override server.port (0 picks a free port)")
    region.set_defaults(run=_region)

    edge = commands.add_parser(
        "edge",
        help="run an edge proxy (TLS, API keys, rate limits, streaming relay, billing)",
        description="Serve users near them: authenticate, validate, rate-limit and meter each request, and "
        "relay it over warm connections to the configured regions, failing over before the first byte.",
    )
    edge.add_argument("--config", metavar="FILE", help="edge TOML file (see configs/edge.toml)")
    edge.add_argument("--port", type=int, help="override server.port (0 picks a free port)")
    edge.set_defaults(run=_edge)

    from edge.admin_cli import add_keys_arguments, add_usage_arguments

    keys = commands.add_parser(
        "keys", help="create, list and revoke API keys", description="API keys, stored hashed in SQLite."
    )
    add_keys_arguments(keys)
    keys.set_defaults(run=_keys)
    usage = commands.add_parser(
        "usage", help="usage and cost per key and day", description="A report from the edge's billing ledger."
    )
    add_usage_arguments(usage)
    usage.set_defaults(run=_usage)

    from nearshore.ca_cli import add_arguments as add_ca_arguments

    ca = commands.add_parser(
        "ca",
        help="a cluster CA and certificates for mutual TLS between edges and regions",
        description="Create the cluster CA and issue server and client certificates.",
    )
    add_ca_arguments(ca)
    ca.set_defaults(run=_ca)

    from netem.up import add_arguments as add_up_arguments

    up = commands.add_parser(
        "up",
        help="bring a topology up: regions, emulated links, edge (Ctrl-C stops it all)",
        description="Start every process of a topology behind emulated links, readiness-checked, and print "
        "the URL, an API key and examples. Ctrl-C stops everything.",
    )
    add_up_arguments(up)
    up.set_defaults(run=_up)

    from netem.chat import add_arguments as add_chat_arguments

    chat = commands.add_parser(
        "chat",
        help="stream an answer through the running topology's edge, as its user would",
        description="Ask the topology started by `nearshore up`, through the user's emulated last mile.",
    )
    add_chat_arguments(chat)
    chat.set_defaults(run=_chat)

    from netem.link import add_arguments as add_link_arguments

    link = commands.add_parser(
        "link",
        help="run emulated links (userspace TCP proxies with delay, jitter, loss, rate, faults)",
        description="Run one or more emulated links in this process, with an HTTP control API.",
    )
    add_link_arguments(link)
    link.set_defaults(run=_link)

    from netem.scenario_cli import add_arguments as add_scenario_arguments

    scenario = commands.add_parser(
        "scenario",
        help="run a latency scenario on a fresh topology (table + PNG chart)",
        description="Bring a topology up, run the scenario, print its table and write its chart.",
    )
    add_scenario_arguments(scenario)
    scenario.set_defaults(run=_scenario)

    demo = commands.add_parser(
        "demo",
        help="the main job: bring up the Lagos topology, stream one answer as a Lagos user, stop",
        description="Start regions, emulated links and the edge, stream an answer through them as the "
        "Lagos user would, print where the time went, and stop everything.",
    )
    from netem.demo import add_arguments as add_demo_arguments

    add_demo_arguments(demo)
    demo.set_defaults(run=_demo)

    from netem.pacer import add_arguments as add_pacer_arguments

    pacer = commands.add_parser(
        "pacer",
        help="a stand-in region that streams tokens at a fixed pace (for benchmarks and tests)",
        description="Speak the regional node's API without a model: fixed token count and pace, "
        "optionally failing or breaking streams on purpose.",
    )
    add_pacer_arguments(pacer)
    pacer.set_defaults(run=_pacer)

    bench = commands.add_parser(
        "bench", help="benchmarks", description="Benchmarks that compare side by side."
    )
    benches = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    bench_region = benches.add_parser(
        "region",
        help="streaming load on a regional node vs llama-cpp-python's own server",
        description="Drive N concurrent streaming requests at a regional node and at llama-cpp-python's "
        "OpenAI server on the same model, threads and prompts; report TTFT, inter-token latency and "
        "aggregate tokens/s side by side.",
    )
    from regional.bench import add_arguments

    add_arguments(bench_region)
    bench_region.set_defaults(run=_bench_region)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"nearshore: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
