"""Each replica's own prefill cost, through a real edge in front of pacers that report one as a region
does (``pft`` in its load report, from its fitted steps): a long prompt goes to the replica that prefills it
soonest, a short one stays with the nearest, and the client group stays where it was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.edge.test_geo import GEO, GEO_SECTIONS, LAGOS, PLACES, Served, _served, ask, client, start_pacers
from tests.edge_fixtures import start_edge
from tests.geoip_db import write_test_db

pytestmark = pytest.mark.slow

# London is 267 km nearer Lagos than Dublin (under 3 ms of round trip at the floor); Dublin's node
# prefills fifty times faster (a GPU's against a CPU's, as far as the edge can tell).
PREFILL_MS_PER_TOKEN = {"london": 0.05, "dublin": 0.001}


@pytest.fixture(scope="module")
def prefill_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("geo-prefill")
    pacers = start_pacers(
        folder,
        **{
            name: {"tokens": 4, "interval_ms": 5, "prefill_ms_per_token": pft}
            for name, pft in PREFILL_MS_PER_TOKEN.items()
        },
    )
    regions = [{"name": name, "city": name, "url": pacer.url} for name, pacer in pacers.items()]
    geo = {**GEO, "database": str(write_test_db(folder / "test-city.mmdb", PLACES))}
    try:
        edge = start_edge(folder / "edge", regions, geo=geo, **GEO_SECTIONS)
    except BaseException:
        for pacer in pacers.values():
            pacer.process.stop()
        raise
    edge.extra += [p.process for p in pacers.values()]
    yield _served(edge)
    edge.stop()


async def test_a_long_prompt_goes_where_it_is_prefilled_soonest_and_a_short_one_to_the_nearest(
    prefill_edge: Served,
) -> None:
    long_prompt = "one two three " * 700  # some 3,000 tokens: 150 ms of prefill in London, 3 in Dublin
    async with client(prefill_edge) as s:
        short = await ask(s, prefill_edge, LAGOS)
        long = await ask(s, prefill_edge, LAGOS, content=long_prompt)
        short_again = await ask(s, prefill_edge, LAGOS)
    assert short.status == 200 and short.region == "london", short.route
    assert long.status == 200 and long.region == "dublin", long.route
    terms = {part.split(" score=")[0].removeprefix("runner-up "): part for part in long.route.split("; ")}
    assert float(terms["london"].split("prefill=")[1].split()[0]) > 100.0  # its own cost, not the default's
    assert short_again.region == "london", short_again.route  # the group stayed with the nearest
