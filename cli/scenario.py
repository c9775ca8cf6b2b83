"""``nearshore scenario NAME``: bring a topology up, run one scenario, print its table, save its chart."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness.launcher import Launcher
from harness.scenarios import SCENARIOS, ScenarioContext
from harness.scenarios.base import check_phases
from harness.topology import describe, load_topology


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(SCENARIOS), help="which scenario")
    parser.add_argument("--topology", default="lagos", help="a name in configs/topologies or a file")
    parser.add_argument("--out", type=Path, default=Path("scenario-results"), help="folder for PNG and JSON")
    parser.add_argument("--repeats", type=int, default=10, help="measurements per path, where it applies")
    parser.add_argument("--phase-s", type=float, help="length of a phase, where a scenario has phases")
    parser.add_argument("--phases", default="", help="which phases to run (comma-separated; default all)")


def main(args: argparse.Namespace) -> int:
    topology = load_topology(args.topology)
    scenario = SCENARIOS[args.name]()
    phases = [p for p in args.phases.split(",") if p]
    check_phases(scenario, phases)
    print(f"{scenario.name}: {scenario.description}\n{describe(topology)}\n", flush=True)
    run_dir = Path(tempfile.mkdtemp(prefix=f"nearshore-{scenario.name}-"))
    launcher = Launcher(
        topology,
        run_dir,
        progress=lambda line: print(line, flush=True),
        health_interval_s=scenario.health_interval_s,
    )
    try:
        running = launcher.start()
        ctx = ScenarioContext(
            topology,
            running,
            launcher,
            args.out,
            repeats=args.repeats,
            phase_s=args.phase_s,
            phases=phases,
        )
        result = scenario.run(ctx)
    finally:
        launcher.stop()
    print("\n" + result.table())
    print(f"data: {result.save(args.out, scenario.name)}")
    return 0
