"""The code's shape, read from its own imports: the CLI sits on top, the base package below everything,
no file too long, and every command keeps its flags."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from nearshore.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("nearshore", "geo", "cache", "gpu", "regional", "edge", "netem")
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            found[".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _is_command(module: str) -> bool:
    return module == "nearshore.cli" or module.startswith("nearshore.cli.") or module == "nearshore.__main__"


def test_the_base_package_imports_nothing_above_it():
    """nearshore (config, protocol, helpers) is the bottom layer: no edge, regional, netem, nor a command."""
    wrong = {
        (module, name)
        for module, path in _modules().items()
        if module.split(".")[0] == "nearshore" and not _is_command(module)
        for name in _imports(path)
        if name.split(".")[0] in PACKAGES[1:] or _is_command(name)
    }
    assert not wrong


def test_only_the_cli_imports_command_modules():
    wrong = {
        (module, name)
        for module, path in _modules().items()
        if not _is_command(module)
        for name in _imports(path)
        if _is_command(name)
    }
    assert not wrong


def test_links_and_their_control_api_import_one_way():
    """netem.control drives netem.link; the link never reaches back (the command wires them together)."""
    link = {name for name in _imports(REPO / "netem" / "link.py") if name.startswith("netem.")}
    assert not any(name.startswith("netem.control") for name in link)


def test_no_file_over_500_lines():
    long = {
        str(path): n for path in _modules().values() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long


def _flags(parser: argparse.ArgumentParser, path: str = "") -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _flags(sub, f"{path} {name}".strip())
        elif not isinstance(action, argparse._HelpAction):
            found.setdefault(path, []).append("/".join(action.option_strings) or action.dest)
    return found


# Every command and flag as they were before the CLI moved above the layers (issue 8, item 6).
FLAGS = {
    "": ["-v/--verbose"],
    "region": ["--config", "--port", "--log-format"],
    # --worker: set by the supervisor of server.workers
    "edge": ["--config", "--port", "--log-format", "--worker", "--listen-fd"],
    "keys create": ["--tenant", "--tier", "--rpm", "--tpm", "--model", "--budget", "--debug", "--db"],
    "keys list": ["--db"],
    "keys revoke": ["key_id", "--db"],
    "usage": ["--db", "--since", "--until"],
    "ca init": ["--dir", "--name", "--force"],
    "ca issue": ["name", "--dir", "--out", "--host", "--client", "--server"],
    "up": ["topology", "--run-dir", "--restart"],
    "chat": ["question", "--max-tokens", "--temperature", "--state"],
    "scenario": ["name", "--topology", "--out", "--repeats", "--phase-s", "--phases"],
    "link": ["--link", "--config", "--control", "--seed", "--no-handshake"],
    "fidelity": ["profiles", "--round-trips", "--seconds", "--seed"],
    "pacer": [
        "--host",
        "--port",
        "--tokens",
        "--interval-ms",
        "--fail-status",
        "--break-after",
        "--eof-delay-ms",
        "--load-state",
        "--name",
    ],
    "hostile": ["--host", "--port", "--mode", "--name", "--tokens", "--limit-s", "--max-connections"],
    "demo": ["question", "--max-tokens", "--topology"],
    "cache-eval": ["file", "--json", "--calibrate", "--misses", "--learned", "--answers"],
    "gpu-check": [
        "--device",
        "--model",
        "--batch-sizes",
        "--context",
        "--steps",
        "--parity",
        "--no-llama",
        "--json",
    ],
    "cache stats": ["--config", "--folder", "--top", "--json", "--show-tenants"],
    "cache clear": ["--config", "--folder", "--all", "--partition", "--older-than"],
    "cache inspect": ["--config", "--folder", "--partition", "--grep", "--limit", "--show-tenants"],
    "bench region": [
        "--concurrency",
        "--max-tokens",
        "--threads",
        "--model-path",
        "--no-peer",
        "--engine",
        "--json",
        "--logs",
    ],
    "bench hostile": ["--seconds", "--concurrency", "--logs"],
    "bench faults": ["--litellm", "--cases", "--repeats", "--logs"],
    "bench fairness": [
        "--flood",
        "--flood-tokens",
        "--echo",
        "--chats",
        "--threads",
        "--no-key-share",
        "--shared-step-ms",
        "--logs",
        "--json",
    ],
    "bench load": [
        "--url",
        "--api-key",
        "--model",
        "--insecure",
        "--ca",
        "--client-cert",
        "--client-key",
        "--up",
        "--up-state",
        "--timeout-s",
        "--rate",
        "--rates",
        "--burstiness",
        "--concurrency",
        "--seconds",
        "--seed",
        "--system-prompts",
        "--system-tokens",
        "--repeat-share",
        "--paraphrase-share",
        "--input-tokens",
        "--output-tokens",
        "--temperature",
        "--slo",
        "--prices",
        "--json",
        "--charts",
        "--self-test",
        "--ceiling-s",
        "--logs",
        "--soak",
        "--sample-s",
        "--pid",
        "--pids-from",
    ],
    "bench geo": ["--sizes", "--database", "--requests", "--working-set", "--seed", "--json"],
    "bench cache": [
        "--sizes",
        "--queries",
        "--small-partitions",
        "--rows-per-partition",
        "--peers",
        "--peer-sizes",
        "--work-dir",
        "--budget-s",
        "--fresh",
        "--ttft-rows",
        "--ttft-requests",
        "--rtt-ms",
        "--json",
        "--logs",
    ],
    "bench edge": [
        "--concurrency",
        "--streams",
        "--waves",
        "--rounds",
        "--tokens",
        "--interval-ms",
        "--no-nginx",
        "--nginx",
        "--no-litellm",
        "--litellm",
        "--rps-rates",
        "--rps-seconds",
        "--rps-budget-s",
        "--unary-concurrency",
        "--unary-seconds",
        "--routing",
        "--json",
        "--logs",
    ],
}


def test_every_command_keeps_its_flags():
    assert _flags(build_parser()) == FLAGS


@pytest.mark.parametrize("argv", [["bench", "edge", "--concurrency", "1,10", "--rps-rates", ""], ["link"]])
def test_a_command_line_reaches_its_runner(argv: list[str]):
    args = build_parser().parse_args(argv)
    assert args.run.__module__.startswith("nearshore.cli.")
