"""``nearshore region`` and ``nearshore edge``: load a config, bind the listeners, build the service, run it.

Kept apart from the services themselves so that building the CLI's parser imports neither llama.cpp nor
the edge's dependencies. The listeners are bound before the service is built (a model loaded, a cache
opened): a port that cannot be had is permanent, and stops the start at once with one line.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import TypeVar

import msgspec

from nearshore import jsonlog, logsafe
from nearshore.config import ConfigError, load_config
from nearshore.listen import BindError, inherited_fds, listen, server_address

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
    # Set by the edge's supervisor on each of its server.workers processes (not for people to type): the
    # worker's index, and the listening sockets it inherits (SETTING=FD, one per socket).
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--listen-fd", action="append", default=[], help=argparse.SUPPRESS)


def run_region(args: argparse.Namespace) -> int:
    from regional.config import RegionConfig
    from regional.node import build_region_app, check_config, run_region

    where = args.config or "defaults"
    config = load_config(args.config, RegionConfig)
    config = _start_logging(args, config, [config.server.shared_secret])
    with _config_errors(where):
        check_config(config)
        listener = listen(server_address(config.server.host, config.server.port, args.port))
        app = build_region_app(config)
    run_region(app, config, listener)
    return 0


def run_edge(args: argparse.Namespace) -> int:
    from edge.config import EdgeConfig
    from edge.node import build_edge_app, check_config, check_files, open_listeners, run_edge

    where = args.config or "defaults"
    config = load_config(args.config, EdgeConfig, warn=args.worker is None)  # a renamed key: warned once
    if config.server.workers > 1 and args.worker is None:
        from edge.workers import bind_for_workers, supervise

        with _config_errors(where):
            check_config(config)
            check_files(config)  # one line here, not one from each worker
            shared = bind_for_workers(config, args.port)  # the supervisor's, handed to each worker
        return supervise(args, config, shared)
    config = _start_logging(args, config, [config.upstream.shared_secret, config.metrics.token])
    with _config_errors(where):
        check_config(config)
        listeners = open_listeners(config, args.port, args.worker, inherited_fds(args.listen_fd))
        app = build_edge_app(config, metrics=listeners.metrics)
    run_edge(app, config, listeners.server, args.worker)
    return 0


def _with_log_format(args: argparse.Namespace, config: T) -> T:
    """The config with ``--log-format`` applied."""
    if args.log_format:
        logging_ = msgspec.structs.replace(config.logging, format=args.log_format)  # type: ignore[attr-defined]
        config = msgspec.structs.replace(config, logging=logging_)  # type: ignore[type-var]
    return config


def _start_logging(args: argparse.Namespace, config: T, secrets: list[str]) -> T:
    """The config with ``--log-format`` applied, logging set up by it, and ``secrets`` kept out of logs."""
    config = _with_log_format(args, config)
    jsonlog.configure(config.logging.format)  # type: ignore[attr-defined]
    for secret in secrets:  # before anything can log it
        logsafe.register_secret(secret)
    return config


@contextlib.contextmanager
def _config_errors(where: str) -> Iterator[None]:
    """A config the service refuses, or a listener that cannot bind, as one ``config error`` line."""
    try:
        yield
    except (ValueError, FileNotFoundError, BindError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
