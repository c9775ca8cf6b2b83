"""What every scenario shares: its context (a running topology) and its result (a table, notes, a chart)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from harness.launcher import Launcher, RunningTopology
from harness.topology import Topology
from nearshore.config import ConfigError


@dataclass
class ScenarioContext:
    topology: Topology
    running: RunningTopology
    launcher: Launcher
    out_dir: Path
    repeats: int = 10
    # For scenarios that run in phases: how long each lasts (None: the scenario's own), and which to run
    # (empty: all).
    phase_s: float | None = None
    phases: list[str] = field(default_factory=list)


@dataclass
class ScenarioResult:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    chart: str = ""
    data: dict = field(default_factory=dict)

    def table(self) -> str:
        widths = [max(len(str(c)), *(len(str(r[i])) for r in self.rows)) for i, c in enumerate(self.columns)]
        line = "  ".join(str(c).ljust(w) for c, w in zip(self.columns, widths, strict=True))
        out = [self.title, "", line, "-" * len(line)]
        out += ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)) for row in self.rows]
        if self.notes:
            out += ["", *self.notes]
        if self.chart:
            out += ["", f"chart: {self.chart}"]
        return "\n".join(out)

    def save(self, out_dir: Path, name: str) -> Path:
        path = out_dir / f"{name}.json"
        path.write_text(json.dumps(asdict(self), indent=2, default=str))
        return path


class Scenario(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]
    health_interval_s: ClassVar[float]  # how often the edge the launcher starts probes its regions
    phase_names: ClassVar[tuple[str, ...]]  # what ``--phases`` may choose from (empty: no phases)

    def run(self, ctx: ScenarioContext) -> ScenarioResult: ...


def check_phases(scenario: Scenario, names: list[str]) -> None:
    """Refuse ``--phases`` the scenario does not have (before anything starts), naming the flag."""
    unknown = [n for n in names if n not in scenario.phase_names]
    if unknown:
        known = ", ".join(scenario.phase_names) or f"none: {scenario.name} has no phases"
        raise ConfigError(f"--phases: unknown phase {', '.join(unknown)} (known: {known})")
