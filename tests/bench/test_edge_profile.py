"""``python -m bench.edge.profile``'s arithmetic: samples per function from py-spy's collapsed stacks, and the
edge's CPU split by part (each stage, the journey around them, the region's answers, the rest) and by
feature."""

from __future__ import annotations

import pytest

from bench.edge.profile import (
    FEATURES,
    UNFEATURED,
    UPSTREAM_READS,
    by_feature,
    by_part,
    feature_of,
    samples,
    stage_frames,
    tally,
)
from edge.stages import default_pipeline

LOOP = "process 1:edge;run (asyncio/runners.py:190);Runner.run (asyncio/runners.py:118)"
PROXY = f"{LOOP};_handle_request (aiohttp/web_protocol.py:577);_proxy (edge/app.py:200)"
STAGES = f"{PROXY};run_journey (edge/pipeline.py:75);_run_stages (edge/pipeline.py:127)"


def stacks() -> list[str]:  # py-spy's collapsed lines
    cut_at_its_root = "_run_stages (edge/pipeline.py:124);route_stage (edge/stages/route.py:30)"
    return [
        f"{STAGES};authenticate_stage (edge/stages/authenticate.py:20);lookup (edge/keys.py:10) 3",
        f"process 1:edge;{cut_at_its_root} 2",  # py-spy read a running process: the root is lost
        f"{STAGES};route_stage (edge/stages/route.py:31);route (geo/route.py:150) 4",
        f"{PROXY};run_journey (edge/pipeline.py:76);_clean_up (edge/pipeline.py:150) 1",
        f"{LOOP};H1Connection.data_received (edge/h1.py:203);SseRelay.data (edge/sse_relay.py:246) 6",
        f"{LOOP};RequestHandler.data_received (aiohttp/web_protocol.py:438) 4",
        "a line py-spy never writes",
    ]


def test_tally_counts_each_function_once_a_sample_with_lines_merged():
    own, inclusive, total = tally(samples(stacks()))
    assert total == 20
    assert inclusive["route_stage (stages/route.py)"] == 6  # two lines of one function
    assert own["route_stage (stages/route.py)"] == 2 and own["route (geo/route.py)"] == 4
    assert inclusive["_proxy (edge/app.py)"] == 8 and inclusive[UPSTREAM_READS] == 6
    assert inclusive["Runner.run (asyncio/runners.py)"] == 18


def test_the_parts_are_the_stages_the_journey_around_them_the_answers_and_the_rest():
    parts = dict(by_part(samples(stacks()), stage_frames(default_pipeline())))
    assert parts["stage authenticate"] == pytest.approx(3 / 20)
    assert parts["stage route"] == pytest.approx(6 / 20)
    assert parts["stage forward"] == 0
    assert parts["the journey outside its stages"] == pytest.approx(1 / 20)
    assert parts["the region's answers as they arrive"] == pytest.approx(6 / 20)
    assert parts["aiohttp's server, the event loop, the rest"] == pytest.approx(4 / 20)
    assert sum(parts.values()) == pytest.approx(1.0)


def test_every_stage_of_the_journey_is_named_as_its_frame_in_order():
    frames = stage_frames(default_pipeline())
    assert [name for name, _ in frames] == default_pipeline().names
    assert ("forward", "forward (stages/forward.py)") in frames
    assert ("settle", "settle_stage (stages/settle.py)") in frames
    assert by_part([], frames) == []  # no samples: no parts


def test_a_sample_is_the_feature_nearest_its_leaf_and_the_rest_is_the_proxy():
    admit = f"{STAGES};admit_stage (edge/stages/admit.py:30)"
    read = samples(
        [
            f"{admit};admit (edge/limits_memory.py:80) 2",
            f"{admit};MutexValue.inc (prometheus_client/values.py:27) 3",  # a counter bumped while admitting
            f"{LOOP};Ledger._flush (edge/ledger.py:280);_insert (edge/ledger.py:415) 4",  # the loop's commit
            f"{STAGES};route_stage (edge/stages/route.py:31);route (geo/route.py:150) 1",
            f"{STAGES};parse_stage (edge/stages/parse.py:20) 5",
            f"{LOOP};H1Connection.data_received (edge/h1.py:203) 5",
        ]
    )
    features = dict(by_feature(read))
    assert list(features) == [*FEATURES, UNFEATURED]
    assert features["limits (RPM/TPM, budgets, a key's share)"] == pytest.approx(2 / 20)
    assert features["metrics (Prometheus)"] == pytest.approx(3 / 20)
    assert features["ledger (usage records, billing)"] == pytest.approx(4 / 20)
    assert features["routing (GeoIP, the router)"] == pytest.approx(1 / 20)
    assert features[UNFEATURED] == pytest.approx(10 / 20)
    assert features["keys (API-key auth)"] == 0 and sum(features.values()) == pytest.approx(1.0)
    assert feature_of("CacheStore.get (cache/store.py)") == "cache (response cache)"
    assert feature_of("a frame without a file") is None and by_feature([]) == []
