"""``nearshore pacer``: a stand-in region that streams tokens at a fixed pace (benchmarks, tests)."""

from __future__ import annotations

import argparse
import asyncio

from harness.standins.pacer import PacerSettings, create_app
from nearshore.httpkit import install_uvloop, serve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer (default 16)")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="gap between tokens (default 20 ms)")
    parser.add_argument("--fail-status", type=int, default=0, help="answer every request with this status")
    parser.add_argument("--break-after", type=int, default=0, help="drop the connection after N tokens")
    parser.add_argument(
        "--eof-delay-ms", type=float, default=0.0, help="end the response this long after [DONE]"
    )
    parser.add_argument(
        "--load-state",
        choices=["ready", "loading", "unloaded", "failed"],
        default=None,
        help="report this load state as a region does (x-nearshore-load, /health's load); default: none",
    )
    parser.add_argument(
        "--clock",
        choices=["stream", "step"],
        default="stream",
        help="each stream paced from its own arrival (default), or every stream's tokens on one shared "
        "step clock, as a region's batched decoder emits them",
    )
    parser.add_argument("--name", default="pacer")


def main(args: argparse.Namespace) -> int:
    install_uvloop()
    settings = PacerSettings(
        args.tokens,
        args.interval_ms / 1000,
        args.fail_status,
        args.break_after,
        args.name,
        args.eof_delay_ms / 1000,
        args.load_state,
        step_clock=args.clock == "step",
    )
    asyncio.run(serve(create_app(settings), args.host, args.port))
    return 0
