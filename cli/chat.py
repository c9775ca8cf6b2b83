"""``nearshore chat``: stream an answer through the running topology's edge, as the Lagos user would."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from harness.chat import stream_answer
from harness.launcher import RunningTopology


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", help="what to ask")
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument(
        "--model", default="", help="which model answers (default: the instruction-tuned one, where served)"
    )
    parser.add_argument("--temperature", type=float, default=0.3)
    parser.add_argument("--state", type=Path, help="a topology's state.json (default: the one `up` started)")


def main(args: argparse.Namespace) -> int:
    try:
        running = RunningTopology.load(args.state)
    except FileNotFoundError as exc:
        print(f"nearshore chat: {exc}", file=sys.stderr)
        return 2
    answer = stream_answer(running, args.question, args.max_tokens, args.temperature, model=args.model)
    return asyncio.run(answer)
