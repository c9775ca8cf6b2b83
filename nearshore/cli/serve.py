"""``nearshore region`` and ``nearshore edge``: load a config, build the service, run it.

Kept apart from the services themselves so that building the CLI's parser imports neither llama.cpp nor
the edge's dependencies.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from nearshore import logsafe
from nearshore.config import ConfigError, load_config
from nearshore.httpkit import PortInUse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML config file (default: built-in defaults)")
    parser.add_argument("--port", type=int, help="override server.port (0 picks a free port)")


def run_region(args: argparse.Namespace) -> int:
    from regional.config import RegionConfig
    from regional.node import build_region_app, run_region

    return _run(args, RegionConfig, build_region_app, run_region, lambda c: [c.server.shared_secret])


def run_edge(args: argparse.Namespace) -> int:
    from edge.config import EdgeConfig
    from edge.node import build_edge_app, run_edge

    return _run(
        args, EdgeConfig, build_edge_app, run_edge, lambda c: [c.upstream.shared_secret, c.metrics.token]
    )


def _run(args: argparse.Namespace, schema: type, build, run, secrets: Callable[[object], list[str]]) -> int:
    where = args.config or "defaults"
    config = load_config(args.config, schema)
    for secret in secrets(config):  # before anything can log it
        logsafe.register_secret(secret)
    try:
        app = build(config)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    try:
        run(app, config, port=args.port)
    except PortInUse as exc:
        raise ConfigError(f"{where}: {exc.key}: {exc}") from None
    return 0
