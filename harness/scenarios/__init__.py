"""Scenarios: repeatable measurements of what a user feels, each a table and a PNG chart.

Adding one is cheap: a module with a class that has ``name``, ``description`` and
``run(ctx) -> ScenarioResult``, listed in ``SCENARIOS``.
"""

from __future__ import annotations

from harness.scenarios.base import Scenario, ScenarioContext, ScenarioResult
from harness.scenarios.cable_cut import CableCut
from harness.scenarios.degraded_link import DegradedLink
from harness.scenarios.lagos_ttft import LagosTtft
from harness.scenarios.region_outage import RegionOutage

SCENARIOS: dict[str, type[Scenario]] = {s.name: s for s in (LagosTtft, RegionOutage, DegradedLink, CableCut)}

__all__ = ["SCENARIOS", "Scenario", "ScenarioContext", "ScenarioResult"]
