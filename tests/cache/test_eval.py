"""``nearshore cache-eval``: each pair through a real ResponseCache (the embedded all-MiniLM-L6-v2, the real
verifier, the shipped threshold); the shipped set meets issue 10's target, and CALIBRATION is the curve
that the shipped set measures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cache import answer_compare, eval_suite, evaluate
from cache.response_cache import CALIBRATION, threshold_for
from cache.settings import CacheSettings
from cli import main

pytestmark = pytest.mark.slow  # loads the embedding model


def write_pairs(path: Path, pairs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path


def test_wilson_interval_and_a_bad_line_named(tmp_path: Path):
    lo, hi = evaluate.wilson(0, 100)
    assert lo == 0.0 and 0.036 < hi < 0.038  # the 95% upper bound of 0 in 100
    lo, hi = evaluate.wilson(50, 100)
    assert 0.40 < lo < 0.41 and 0.59 < hi < 0.60
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": "x", "b": "y", "same": true}\n{"a": "x"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        evaluate.load_pairs(bad)


def test_a_small_file_through_the_real_cache_counts_hits_and_false_hits(tmp_path: Path, capsys):
    pairs = [
        {"a": "How do I reset my password?", "b": "How can I reset my password?", "same": True},
        {"a": "What is the capital of Kenya?", "b": "What is the capital of Kenya?", "same": True},
        {"a": "Is it safe to drink tap water in London?", "b": "Is it unsafe to drink tap water in London?",
         "same": False, "kind": "negation"},
        {"a": "What can I buy with 100 dollars?", "b": "What can I buy with 1000 dollars?", "same": False,
         "kind": "number", "note": "other fields are ignored"},
        {"a": "How do I make jollof rice?", "b": "How do I fix a flat tyre?", "same": False, "kind": "topic"},
    ]  # fmt: skip
    path = write_pairs(tmp_path / "pairs.jsonl", pairs)
    assert main(["cache-eval", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["positives"] == 2 and report["hits_on_positives"] == 2 and report["exact_hits"] == 1
    assert report["negatives"] == 3 and report["false_hits"] == 0 and report["hard_negatives"] == 2
    assert report["threshold"] == threshold_for(CacheSettings().target_false_hit_rate)
    assert report["offline_disagreements"] == 0  # the cache's lookups and the curve's rule agree
    assert report["kinds"]["negation"] == {"same": False, "pairs": 1, "hits": 0}
    assert [row["target_false_hit_rate"] for row in report["curve"]] == list(evaluate.TARGETS)
    cosine_only = report["cosine_only"][0]
    assert cosine_only["threshold"] == 0.90 and cosine_only["false_hits"] >= 1  # tap water: cosine 0.99
    assert main(["cache-eval", str(path), "--calibrate"]) == 0  # the plain report, with the table
    out = capsys.readouterr().out
    assert "cache-eval: 5 pairs" in out and "paraphrase hit rate" in out and "measured calibration" in out


def test_the_suite_measures_every_set_apart_with_the_generated_split_and_the_worst(capsys):
    assert main(["cache-eval", "--json", "--calibrate"]) == 0
    report = json.loads(capsys.readouterr().out)
    sets = report["sets"]
    assert {"project", "holdout", "seeds-pcm-fr", "generated-dev", "generated-test"} <= set(sets)
    assert {s["role"] for s in sets.values()} >= {"dev", "test"}
    generated = report["generated"]
    assert generated["split"]["dev"] > 500 and generated["split"]["test"] > 500
    assert set(generated["caught_by"]["test"]) == {"listed", "general"}
    assert {"gen-swap", "gen-sibling", "gen-qualifier", "gen-negation"} <= set(generated["by_transformation"])
    # The shipped default keeps every set's hard negatives at or under 1% (the bound the config promises).
    for name, s in sets.items():
        assert s["hard_false_hit_rate"] <= 0.01, name
        assert s["offline_disagreements"] == 0, name
    assert report["worst"]["unseen"]["hard_false_hit_rate"] <= 0.01
    assert sets["project"]["hit_rate"] >= 0.45  # the cost of the strict rule, reported beside it
    assert [row["threshold"] for row in report["curve"]][:2] == [0.40, 0.42]
    # CALIBRATION is what the dev sets measure, and only they.
    assert evaluate.compress([tuple(row) for row in report["calibration"]]) == list(CALIBRATION)
    # The plain report of the same run (the CLI prints it without --json; its text path is run on a small
    # file above, not twice over every set).
    text = eval_suite.format_suite(report)
    assert "worst never tuned on" in text and "generated hard negatives" in text


def test_the_audits_judge_is_measured_on_labelled_answers_and_its_weights_are_the_dev_fit(capsys):
    assert main(["cache-eval", "--answers", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fitted_on_dev"] == {"weights": answer_compare.WEIGHTS, "bias": answer_compare.BIAS}
    test = report["splits"]["test"]
    assert test["right_answers"] > 50 and test["wrong_answers"] > 50
    # Its own error, held out: few right answers called wrong (a good entry evicted), and the share of
    # wrong ones it calls right is what the measured rate can miss.
    assert test["false_alarms"] / test["right_answers"] <= 0.05
    assert test["misses"] / test["wrong_answers"] <= 0.15
