"""``nearshore region`` and ``nearshore edge``: load a config, build the service, run it.

Kept apart from the services themselves so that building the CLI's parser imports neither llama.cpp nor
the edge's dependencies.
"""

from __future__ import annotations

import argparse
from typing import TypeVar

import msgspec

from nearshore import jsonlog, logsafe
from nearshore.config import ConfigError, load_config
from nearshore.httpkit import PortInUse

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML config file (default: built-in defaults)")
    parser.add_argument("--port", type=int, help="override server.port (0 picks a free port)")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="override logging.format (json: one JSON object a line, and one line per request)",
    )


def add_edge_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    # Set by the edge's supervisor on each of its server.workers processes (not for people to type).
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)


def run_region(args: argparse.Namespace) -> int:
    from regional.config import RegionConfig
    from regional.node import build_region_app, run_region

    config = load_config(args.config, RegionConfig)
    return _run(args, config, build_region_app, run_region, [config.server.shared_secret])


def run_edge(args: argparse.Namespace) -> int:
    from edge.config import EdgeConfig
    from edge.node import build_edge_app, check_config, run_edge

    config = load_config(args.config, EdgeConfig)
    if config.server.workers > 1 and args.worker is None:
        try:
            check_config(config)
        except (ValueError, FileNotFoundError) as exc:
            raise ConfigError(f"{args.config or 'defaults'}: {exc}") from exc
        from nearshore.cli.workers import supervise

        return supervise(args, config.server.workers, config.server.host, config.server.port)
    if args.worker is not None and config.metrics.port:  # each worker's metrics on a port of its own
        metrics = msgspec.structs.replace(config.metrics, port=config.metrics.port + args.worker)
        config = msgspec.structs.replace(config, metrics=metrics)
    secrets = [config.upstream.shared_secret, config.metrics.token]
    return _run(
        args, config, build_edge_app, lambda app, c, port: run_edge(app, c, port, args.worker), secrets
    )


def _with_log_format(args: argparse.Namespace, config: T) -> T:
    """The config with ``--log-format`` applied."""
    if args.log_format:
        logging_ = msgspec.structs.replace(config.logging, format=args.log_format)  # type: ignore[attr-defined]
        config = msgspec.structs.replace(config, logging=logging_)  # type: ignore[type-var]
    return config


def _run(args: argparse.Namespace, config: object, build, run, secrets: list[str]) -> int:
    where = args.config or "defaults"
    config = _with_log_format(args, config)
    jsonlog.configure(config.logging.format)  # type: ignore[attr-defined]
    for secret in secrets:  # before anything can log it
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
