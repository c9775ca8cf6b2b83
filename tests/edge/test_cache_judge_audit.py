"""The pair judge's threshold learned per partition by the live audit, through a real edge over a real
region (the embedded model) with the shipped judge: a partition's own right verdicts open it where the
calibration would not, and a judged hit found wrong closes its partition above it (cache/audit_judge.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv
from tests.conftest import Node
from tests.edge.test_cache import ask, question, stored
from tests.edge.test_cache_audit import health, plant, scrape
from tests.edge_fixtures import START_TIMEOUT_S, start_edge

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
COUNTRIES = (
    "Nigeria", "France", "Japan", "Kenya", "Ghana", "Egypt", "Italy", "Spain", "Germany", "Canada", "Brazil",
    "India", "China", "Russia", "Mexico", "Australia", "Portugal", "Greece", "Turkey", "Sweden", "Norway",
    "Poland", "Argentina", "Peru", "Chile",
)  # fmt: skip
WRONG = "Bananas turn yellow as they ripen, because the green chlorophyll in their peel breaks down."


def linked(region: Node, folder: Path, profile: str) -> Iterator[str]:
    """The shared region behind an emulated link (``profile``: a shipped name or a file)."""
    port, control = free_port(), free_port()
    target = region.url.removeprefix("http://")
    argv = [
        "link",
        "--control",
        f"127.0.0.1:{control}",
        "--link",
        f"far=127.0.0.1:{port}->{target}@{profile}",
    ]
    link = ManagedProcess("link", nearshore_argv(*argv), folder / "link.log").start()
    try:
        link.wait_http(f"http://127.0.0.1:{control}/health", timeout_s=START_TIMEOUT_S)
        yield f"http://127.0.0.1:{port}"
    finally:
        link.stop()


@pytest.fixture(scope="module")
def far_region(region: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shared region behind an emulated Lagos-London link (100 ms RTT): a semantic lookup (embedding,
    verifier, judge) usually wins the race to its first byte, as it does from Lagos."""
    yield from linked(region, tmp_path_factory.mktemp("far-region"), "lagos-london")


@pytest.fixture(scope="module")
def farther_region(region: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shared region 600 ms away: where one served hit must happen, the lookup wins its race even on a
    busy machine (at 100 ms it once lost, and the hit was a miss)."""
    folder = tmp_path_factory.mktemp("farther-region")
    profile = Path(REPO / "configs/netem/lagos-london.toml").read_text()
    profile = profile.replace('name = "lagos-london"', 'name = "far-away"').replace(
        "delay_ms = 50.0", "delay_ms = 300.0"
    )
    (folder / "far-away.toml").write_text(profile)
    yield from linked(region, folder, str(folder / "far-away.toml"))


def asked(content: str) -> dict:
    return question(content, max_tokens=12)


def metric(edge, name: str) -> float:
    return scrape(edge).get("nearshore_edge:" + name, 0.0)


async def settled(edge, name: str, rounds: int = 600) -> float:
    """The metric once it stops moving (the audit's verdicts come in the background)."""
    last, still = -1.0, 0
    for _ in range(rounds):
        value = metric(edge, name)
        still = still + 1 if value == last else 0
        if still >= 20:
            return value
        last = value
        await asyncio.sleep(0.1)
    return last


async def test_a_partitions_own_right_verdicts_open_the_judge_where_the_calibration_would_not(
    tmp_path, far_region: str
):
    # 1.01: no calibrated threshold, the judge serves only where the audit proved it; a 20% target is
    # proved by 16 right verdicts of 16 (the upper end of their 95% interval).
    cache = {"folder": str(tmp_path / "cache"), "store_truncated": True, "target_false_hit_rate": 0.2}
    edge = start_edge(tmp_path / "edge", [("london", far_region)], cache={**cache, "judge_threshold": 1.01})
    agreed = 'cache_audits_total{mode="explored",verdict="agree"}'
    opened = 'cache_judge_partitions{state="opened"}'
    try:
        key = edge.new_key(tenant="learning", rpm=10_000, tpm=10**7)
        asked_before = 0
        for country in COUNTRIES:
            if metric(edge, opened):
                break
            await stored(edge, key, asked(f"What is the capital of {country}?"))
            # The verifier cannot explain "the name of" and the judge is fairly sure (0.91-0.98), but
            # nothing is proved yet: a miss, whose region answer is judged against the candidate's, for free.
            _, headers, _ = await ask(edge, key, asked(f"What's the name of the capital of {country}?"))
            assert headers["x-nearshore-cache"] == "MISS" or asked_before >= 16, (country, headers)
            asked_before += 1
        assert await settled(edge, agreed) >= 16, "the region's answers to the rewordings were not judged"
        assert metric(edge, opened) == 1
        assert health(edge)["cache_audit"]["judge"]["partitions_opened"] == 1

        served = 0
        for country in COUNTRIES[:asked_before]:
            _, headers, _ = await ask(edge, key, asked(f"Which city is the capital of {country}?"))  # ~0.98
            served += headers["x-nearshore-cache"] == "SEMANTIC"
        raced = await settled(edge, 'cache_audits_total{mode="raced",verdict="agree"}')
        assert served + raced >= asked_before // 2  # found (served, or beaten by the region's first byte)
        assert served >= 1

        # Another tenant's partition has proved nothing: the same rewording is a miss there.
        other = edge.new_key(tenant="new", rpm=10_000, tpm=10**7)
        await stored(edge, other, asked("What is the capital of Chile?"))
        _, headers, _ = await ask(edge, other, asked("Which city is the capital of Chile?"))
        assert headers["x-nearshore-cache"] == "MISS"
    finally:
        edge.stop()


async def test_a_judged_hit_found_wrong_closes_its_partition_above_it_and_no_other(
    tmp_path, farther_region: str
):
    # The calibrated threshold at a 30% target lets the judge serve from 0.60 (one wrong verdict of one
    # does not switch the partition to exact hits at 30%, so what closes the family is the judge's floor).
    cache = {"folder": str(tmp_path / "cache"), "store_truncated": True, "target_false_hit_rate": 0.3}
    edge = start_edge(tmp_path / "edge", [("london", farther_region)], cache=cache)
    try:
        misled = edge.new_key(tenant="misled", rpm=10_000, tpm=10**7)
        control = edge.new_key(tenant="control", rpm=10_000, tpm=10**7)
        await stored(edge, misled, asked("What is the capital of Nigeria?"))
        plant(edge, "What is the capital of Nigeria?", WRONG)  # (the only entry yet)
        await stored(edge, misled, asked("What is the capital of Ghana?"))
        await stored(edge, control, asked("What is the capital of Ghana?"))

        # The judge (about 0.98 here) serves the planted answer once; the audit finds it wrong.
        status, headers, body = await ask(edge, misled, asked("Which city is the capital of Nigeria?"))
        assert status == 200 and headers["x-nearshore-cache"] == "SEMANTIC" and WRONG in body.decode()
        for _ in range(600):
            if metric(edge, 'cache_judge_partitions{state="closed"}') == 1:
                break
            await asyncio.sleep(0.1)
        assert metric(edge, 'cache_audits_total{mode="sampled",verdict="disagree"}') == 1
        assert health(edge)["cache_audit"]["judge"]["partitions_closed"] == 1
        assert health(edge)["cache_audit"]["partitions_off"] == 0

        # A rewording the judge is less sure of (about 0.94) is no longer served in that partition ...
        _, headers, _ = await ask(edge, misled, asked("What's the name of the capital of Ghana?"))
        assert headers["x-nearshore-cache"] == "MISS"
        # ... and still is in another tenant's.
        found = False
        for _ in range(3):  # (a hit beaten by the region's first byte is a miss: ask until one wins)
            _, headers, _ = await ask(
                edge,
                control,
                asked("What's the name of the capital of Ghana?"),
                {"Cache-Control": "no-store"},
            )
            found = found or headers["x-nearshore-cache"] == "SEMANTIC"
        assert found
    finally:
        edge.stop()
