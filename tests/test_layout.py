"""The code's shape, read from its own imports (ARCHITECTURE.md, "Layers"): one order of rooms,
nearshore < geo, cache, gpu, netem < edge, regional < harness < bench < cli, no import up it, no circle
between files, no file too long, and every command keeps its flags."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from pathlib import Path

import pytest

from cli import build_parser

REPO = Path(__file__).resolve().parents[1]
# Each room's rank: a module may import only its own room and lower ranks.
RANK = {
    "nearshore": 0,
    "geo": 1,
    "cache": 1,
    "gpu": 1,
    "netem": 1,
    "edge": 2,
    "regional": 2,
    "harness": 3,
    "bench": 4,
    "cli": 5,
}
# Rooms of one rank that must not see each other: the edge proxy never loads the model, the region never
# routes, and the base's command shim (``python -m nearshore``) is the one way down into cli.
FORBIDDEN = {("edge", "regional"), ("edge", "gpu"), ("regional", "edge")}
ENTRY_SHIM = "nearshore.__main__"
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    found = {}
    for package in RANK:
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


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        module: {n for n in _imports(path) if n in modules and n != module}
        for module, path in modules.items()
    }


def test_every_import_runs_down_the_layers():
    wrong = []
    for module, targets in _graph().items():
        room = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if module == ENTRY_SHIM and other == "cli":
                continue
            if (room, other) in FORBIDDEN or RANK[other] > RANK[room]:
                wrong.append(f"{module} imports {target}")
    assert not wrong


def test_no_circle_between_files():
    graph, circles = _graph(), []
    # Tarjan's strongly connected components, iteratively.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    assert not circles


def test_the_rooms_are_the_ones_the_architecture_names():
    """Every top-level Python package is one of the ranked rooms (or the tests)."""
    packages = {p.parent.name for p in REPO.glob("*/*.py") if not p.parent.name.startswith(".")} - {"tests"}
    assert packages == set(RANK)


def test_the_readme_map_matches_the_tree():
    """A newcomer's map: the README's "Where things are" lists each top-level folder once, in one line, and
    no folder the tree lacks."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Where things are\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `([\w.-]+)/`: \S", section, flags=re.M)
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    folders = {
        line.split("/")[0] for line in tracked.splitlines() if "/" in line and not line.startswith(".")
    }
    assert len(listed) == len(set(listed))
    assert set(listed) == folders


def test_links_and_their_control_api_import_one_way():
    """netem.control drives netem.link; the link never reaches back (the command wires them together)."""
    link = {name for name in _imports(REPO / "netem" / "link.py") if name.startswith("netem.")}
    assert not any(name.startswith("netem.control") for name in link)


STAGES = "edge.stages"
# Where the stages are put in order: the package itself, and the edge's app and process that run it.
STAGE_ASSEMBLY = {STAGES, "edge.app", "edge.node"}


def test_no_stage_imports_another_and_what_they_share_lives_below_them():
    """The edge's stages are rooms (ARCHITECTURE.md, "The journey of one request"): one file per stage in
    edge/stages/, none importing another; what two stages share lives below them, and only the assembly
    (which puts them in order) imports a stage."""
    graph = _graph()
    stages = {m for m in graph if m.startswith(STAGES + ".")}
    assert {m.removeprefix(STAGES + ".") for m in stages} >= {
        "authenticate", "parse", "rightsize", "admit", "cut", "cache", "route", "gate", "forward", "relay",
        "continuation", "store", "settle",
    }  # fmt: skip
    wrong = []
    for module, targets in graph.items():
        if not module.startswith("edge."):
            continue
        for target in targets:
            if target not in stages or target == module:
                continue
            if module in stages:
                wrong.append(f"stage {module} imports stage {target}")
            elif module not in STAGE_ASSEMBLY:
                wrong.append(f"{module}, below the stages, imports stage {target}")
    assert not wrong


def test_no_file_over_500_lines():
    files = [*_modules().values(), *sorted((REPO / "tests").rglob("*.py"))]
    long = {str(path): n for path in files if (n := len(path.read_text().splitlines())) > MAX_LINES}
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
    "keys create": [
        "--tenant",
        "--tier",
        "--rpm",
        "--tpm",
        "--model",
        "--budget",
        "--debug",
        "--substitute",
        "--db",
        "--postgres",
    ],
    "keys list": ["--db", "--postgres"],
    "keys revoke": ["key_id", "--db", "--postgres"],
    "keys update": [
        "key_id",
        "--tier",
        "--rpm",
        "--tpm",
        "--model",
        "--all-models",
        "--budget",
        "--no-budget",
        "--debug/--no-debug",
        "--substitute/--no-substitute",
        "--db",
        "--postgres",
    ],
    "usage": ["--db", "--postgres", "--since", "--until"],
    "ca init": ["--dir", "--name", "--force"],
    "ca issue": ["name", "--dir", "--out", "--host", "--client", "--server"],
    "up": ["topology", "--run-dir", "--restart"],
    "chat": ["question", "--max-tokens", "--model", "--temperature", "--state"],
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
        "--clock",
        "--name",
    ],
    "hostile": ["--host", "--port", "--mode", "--name", "--tokens", "--limit-s", "--max-connections"],
    "demo": ["question", "--max-tokens", "--model", "--topology"],
    "cache-eval": [
        "file",
        "--json",
        "--calibrate",
        "--calibrate-judge",
        "--target",
        "--misses",
        "--learned",
        "--answers",
    ],
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
        "--schema",
        "--repeats",
        "--json",
        "--logs",
    ],
    "bench grammar": ["--model", "--repeats", "--json"],
    "bench region-rss": [
        "--requests",
        "--every",
        "--prompt-words",
        "--kind",
        "--threads",
        "--logs",
        "--json",
    ],
    "bench hostile": ["--seconds", "--concurrency", "--logs"],
    "bench faults": ["--litellm", "--cases", "--repeats", "--logs"],
    "bench keys": ["--edges", "--rounds", "--requests", "--logs", "--json"],
    "bench fairness": [
        "--flood",
        "--flood-tokens",
        "--echo",
        "--embeddings",
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
        "--no-audit",
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
        "--clock",
        "--no-nginx",
        "--nginx",
        "--floor",
        "--no-litellm",
        "--litellm",
        "--rps-rates",
        "--rps-seconds",
        "--rps-budget-s",
        "--unary-concurrency",
        "--unary-seconds",
        "--routing",
        "--fleet",
        "--tls",
        "--json",
        "--logs",
    ],
}


def test_every_command_keeps_its_flags():
    assert _flags(build_parser()) == FLAGS


@pytest.mark.parametrize("argv", [["bench", "edge", "--concurrency", "1,10", "--rps-rates", ""], ["link"]])
def test_a_command_line_reaches_its_runner(argv: list[str]):
    args = build_parser().parse_args(argv)
    assert args.run.__module__.startswith("cli.")
