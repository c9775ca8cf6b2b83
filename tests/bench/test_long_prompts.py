"""``python -m bench.edge.long_prompts`` keeps working: both edges, both parts, every long prompt answered."""

from __future__ import annotations

from pathlib import Path

from bench.edge import long_prompts
from regional.model_store import resolve_model_path


def test_a_small_run_measures_both_edges_alone_and_beside_the_long_prompts(tmp_path: Path):
    parts = long_prompts.run(tmp_path, prompts=2, tokens=12, gguf=str(resolve_model_path("")), size=20_000)
    assert [(p.edge, p.part) for p in parts] == [
        ("estimate", "alone"),
        ("estimate", "beside 2 long prompts"),
        ("exact", "alone"),
        ("exact", "beside 2 long prompts"),
    ]
    # between the role event, 12 tokens, the finish and [DONE]: 14 gaps, none lost
    assert all(len(p.gaps_s) == 14 for p in parts)
    assert [p.statuses for p in parts if p.statuses] == [[200, 200], [200, 200]]
    assert "longest gap" in parts[-1].line()


def test_a_long_prompt_is_as_long_as_asked():
    body = long_prompts.long_prompt(50_000)
    assert 49_000 < len(body) <= 50_000
