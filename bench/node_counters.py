"""A regional node's own step counters, read from its ``/metrics`` before and after a run: what its steps
cost (``engine_step_seconds`` over ``engine_steps``) and what the grammars took of that
(``grammar_seconds`` over ``grammar_tokens``), measured inside the node rather than from the client."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = ("engine_steps", "engine_step_seconds", "grammar_seconds", "grammar_tokens", "generation_tokens")


def read(url: str) -> dict[str, float]:
    """The node's counters, summed over its label sets (one model: one set)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    values = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        name = family.name.removeprefix("nearshore:")
        if name in values:
            values[name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return values


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in COUNTERS}


def step_cost(deltas: list[dict[str, float]]) -> dict[str, float]:
    """Mean step time, grammar time per constrained token and the grammars' share of the step time, over
    runs' deltas."""
    total = {name: sum(d[name] for d in deltas) for name in COUNTERS}
    steps, step_s = total["engine_steps"], total["engine_step_seconds"]
    return {
        "step_ms": step_s / steps * 1000 if steps else 0.0,
        "grammar_us_per_token": (
            total["grammar_seconds"] / total["grammar_tokens"] * 1e6 if total["grammar_tokens"] else 0.0
        ),
        "grammar_share": total["grammar_seconds"] / step_s if step_s else 0.0,
    }
