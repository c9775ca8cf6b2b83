"""``nearshore demo``: the main job. Bring up the Lagos topology, stream one answer as the Lagos user
would (through the last mile, the Lagos edge, and the ocean to London), then take it all down."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from harness.chat import stream_answer
from harness.launcher import Launcher
from harness.topology import describe, load_topology

DEFAULT_QUESTION = "Give three tips for a first visit to Lagos."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", nargs="?", default=DEFAULT_QUESTION, help="what to ask the model")
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument(
        "--model", default="", help="which model answers (default: the instruction-tuned one, where served)"
    )
    parser.add_argument("--topology", default="lagos", help="a name in configs/topologies or a file")


def main(args: argparse.Namespace) -> int:
    topology = load_topology(args.topology)
    run_dir = Path(tempfile.mkdtemp(prefix="nearshore-demo-"))
    print(f"{describe(topology)}\n", flush=True)
    launcher = Launcher(topology, run_dir, progress=lambda line: print(line, flush=True))
    try:
        running = launcher.start()
        print(f"\n> {args.question}\n", flush=True)
        return asyncio.run(stream_answer(running, args.question, args.max_tokens, model=args.model))
    finally:
        launcher.stop()
