"""Issue 9's routing acceptance, through real edge processes in front of pacers on loopback.

Regions are pacers placed in cities. On loopback every round trip is far below light's floor, so the
floor of the catalog's city stands in (geo/latency.py): seen from a Lagos edge, London (5,020 km) beats
Dublin (5,287 km) and Virginia (8,770 km). The client's address comes from X-Forwarded-For behind the
trusted proxy 127.0.0.1/32; a connection from 127.0.0.2 is an untrusted peer. ``x-nearshore-debug: route``
shows the router's choice (the replica first in the failover order), ``x-nearshore-region`` the region that
served, and the edge's ``/health`` each replica's status.

Three edges share the work: two over the same three pacers (a GeoIP database written for the test, and the
embedded GeoLite2 reached through ``fallback_to_embedded`` from a corrupt file), and one in front of a
region of three replicas and a loading stand-in. The tests that kill pacers come last and restart them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from geo.places import floor_rtt_ms
from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv
from nearshore.protocol.sse import iter_data
from tests.edge_fixtures import START_TIMEOUT_S, Edge, Pacer, start_edge
from tests.geoip_db import write_test_db

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
# Where both databases put them (the embedded GeoLite2 City's own answers, and the written file's).
LAGOS, VIRGINIA, LONDON, FRANKFURT = "105.112.1.1", "54.239.0.1", "18.130.0.1", "2a01:4f8::1"
ONLY_IN_WRITTEN = "8.8.8.8"  # the written file puts it in Lagos; GeoLite2 puts it in the United States
PLACES = {
    "105.112.0.0/16": {"country": "NG", "continent": "AF", "city": "Lagos", "lat": 6.45, "lon": 3.39},
    "54.239.0.0/16": {"country": "US", "continent": "NA", "city": "Ashburn", "lat": 39.04, "lon": -77.49},
    "18.130.0.0/16": {"country": "GB", "continent": "EU", "city": "London", "lat": 51.51, "lon": -0.09},
    "2a01:4f8::/32": {"country": "DE", "continent": "EU", "city": "Frankfurt", "lat": 50.11, "lon": 8.68},
    "8.8.8.0/24": {"country": "NG", "continent": "AF", "city": "Lagos", "lat": 6.45, "lon": 3.39},
}
GEO_REGIONS = ("london", "dublin", "virginia")
EU = {"london", "dublin"}
# Short probes, ejections and hold, so that ejection and return take seconds; probes need three failures
# (3 s) to take a replica down, so a killed one is ejected by the requests that fail on it first.
GEO_SECTIONS: dict[str, dict[str, object]] = {
    "upstream": {"health_interval_s": 1.0, "health_timeout_s": 1.0},
}
GEO = {
    "trusted_proxies": ["127.0.0.1/32"],
    "residency": [{"name": "eu-only", "continents": ["EU"], "regions": sorted(EU)}],
    "health": {"unhealthy_threshold": 3, "base_ejection_s": 1.0, "max_ejected_percent": 100.0},
    "routing": {"hold_s": 0.5, "switch_margin_ms": 1.0, "switch_margin_ratio": 0.0},
}
FAR_AWAY = {"latitude": -33.87, "longitude": 151.21, "country": "AU", "continent": "OC"}  # Sydney
DOCUMENT = "".join(
    f"Clause {i}: the parties agree that the edge routes by expected TTFT. " for i in range(48)
)


# --- processes -------------------------------------------------------------------------------------------


def start_pacers(folder: Path, **flags_by_name: dict[str, object]) -> dict[str, Pacer]:
    """Every pacer started at once, then waited for: they boot side by side."""
    started: dict[str, Pacer] = {}
    for name, flags in flags_by_name.items():
        port = free_port()
        args = ["pacer", "--port", str(port), "--name", name]
        for flag, value in flags.items():
            args += [f"--{flag.replace('_', '-')}", str(value)]
        process = ManagedProcess(name, nearshore_argv(*args), folder / f"{name}.log").start()
        started[name] = Pacer(f"http://127.0.0.1:{port}", process)
    try:
        for pacer in started.values():
            pacer.process.wait_http(pacer.url + "/health", timeout_s=START_TIMEOUT_S)
    except BaseException:
        for pacer in started.values():
            pacer.process.stop()
        raise
    return started


def kill(pacer: Pacer) -> None:
    """SIGKILL, as a crash: nothing is closed politely."""
    proc = pacer.process.proc
    assert proc is not None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def restart(pacer: Pacer) -> None:
    """The same command again, so on the same port."""
    pacer.process.start()
    pacer.process.wait_http(pacer.url + "/health", timeout_s=START_TIMEOUT_S)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("edge-geo")


@pytest.fixture(scope="module")
def geo_pacers(folder: Path) -> Iterator[dict[str, Pacer]]:
    pacers = start_pacers(folder, **{name: {"tokens": 64, "interval_ms": 5} for name in GEO_REGIONS})
    yield pacers
    for pacer in pacers.values():
        pacer.process.stop()


def geo_catalog(pacers: dict[str, Pacer]) -> list[dict[str, object]]:
    return [{"name": name, "city": name, "url": pacers[name].url} for name in GEO_REGIONS]


@dataclass
class Served:
    edge: Edge
    key: str


def _served(edge: Edge, **key_fields: object) -> Served:
    return Served(edge, edge.new_key(rpm=10**6, tpm=10**9, debug=True, **key_fields))


@pytest.fixture(scope="module")
def written(folder: Path, geo_pacers: dict[str, Pacer]) -> Iterator[Served]:
    database = write_test_db(folder / "test-city.mmdb", PLACES)
    geo = {**GEO, "database": str(database)}
    edge = start_edge(folder / "written", geo_catalog(geo_pacers), geo=geo, **GEO_SECTIONS)
    yield _served(edge)
    edge.stop()


@pytest.fixture(scope="module")
def embedded(folder: Path, geo_pacers: dict[str, Pacer]) -> Iterator[Served]:
    """The embedded GeoLite2, reached by falling back from a corrupt file (issue 9's bad input)."""
    corrupt = folder / "corrupt.mmdb"
    corrupt.write_bytes(b"\xab\xcd\xef MaxMind.com" + os.urandom(4096))
    geo = {**GEO, "database": str(corrupt), "fallback_to_embedded": True}
    edge = start_edge(folder / "embedded", geo_catalog(geo_pacers), geo=geo, **GEO_SECTIONS)
    yield _served(edge)
    edge.stop()


@pytest.fixture(params=["written", "embedded"])
def geo_edge(request: pytest.FixtureRequest) -> Served:
    return request.getfixturevalue(request.param)


@dataclass
class Pool:
    served: Served
    pacers: dict[str, Pacer]


@pytest.fixture(scope="module")
def pool(folder: Path) -> Iterator[Pool]:
    """One region of three replicas (slow enough to hold streams open), and a stand-in that is loading,
    behind a replica that is not ("staging") and alone ("solo"); tenants are pinned to each. The GeoIP
    file is missing and the edge falls back to the embedded one."""
    slow = {"tokens": 400, "interval_ms": 25}
    pacers = start_pacers(
        folder,
        p0=slow,
        p1=slow,
        p2=slow,
        loading={"tokens": 4, "interval_ms": 5, "load_state": "loading"},
        ready={"tokens": 4, "interval_ms": 5},
    )
    regions = [
        {
            "name": "pool",
            "city": "london",
            "replicas": [pacers[p].url for p in ("p0", "p1", "p2")],
            "capacity": 16,
        },
        {"name": "staging", **FAR_AWAY, "replicas": [pacers["loading"].url, pacers["ready"].url]},
        {"name": "solo", **FAR_AWAY, "url": pacers["loading"].url},
    ]
    geo = {
        "database": str(folder / "missing.mmdb"),
        "fallback_to_embedded": True,
        "residency": [
            {"name": "staging-only", "tenants": ["staging-team"], "regions": ["staging"]},
            {"name": "solo-only", "tenants": ["solo-team"], "regions": ["solo"]},
        ],
        # Spread once a replica holds 3 more requests than the least loaded (and 1.5x as many).
        "routing": {"balance_abs": 2, "balance_rel": 1.5},
    }
    try:
        edge = start_edge(folder / "pool", regions, geo=geo)
    except BaseException:
        for pacer in pacers.values():
            pacer.process.stop()
        raise
    edge.extra += [p.process for p in pacers.values()]
    yield Pool(_served(edge), pacers)
    edge.stop()


# --- the client ------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    region: str  # x-nearshore-region: the region that served
    route: str  # x-nearshore-route: the router's choice, its terms, the runner-up
    error: dict
    elapsed_s: float

    @property
    def chosen(self) -> str:
        """The replica the router put first."""
        return self.route.split(" score=")[0]


@contextlib.asynccontextmanager
async def client(served: Served, from_address: str = "127.0.0.1") -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(ssl=served.edge.ssl_context(), local_addr=(from_address, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


def _request(served: Served, content: str, max_tokens: int, forwarded_for: str | None, key: str | None):
    headers = {"Authorization": f"Bearer {key or served.key}", "x-nearshore-debug": "route"}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = forwarded_for
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    return headers, body


async def ask(
    session: aiohttp.ClientSession,
    served: Served,
    forwarded_for: str | None = None,
    *,
    content: str = "hi",
    max_tokens: int = 1,
    key: str | None = None,
) -> Answer:
    headers, body = _request(served, content, max_tokens, forwarded_for, key)
    started = time.perf_counter()
    async with session.post(served.edge.url + "/v1/chat/completions", json=body, headers=headers) as r:
        payload = await r.json(content_type=None)
        return Answer(
            r.status,
            r.headers.get("x-nearshore-region", ""),
            r.headers.get("x-nearshore-route", ""),
            payload.get("error") or {},
            time.perf_counter() - started,
        )


@contextlib.asynccontextmanager
async def open_stream(
    session: aiohttp.ClientSession, served: Served, content: str, max_tokens: int
) -> AsyncIterator[aiohttp.ClientResponse]:
    """A streamed answer, open (and counted in its replica's in-flight) until the block ends."""
    headers, body = _request(served, content, max_tokens, None, None)
    async with session.post(
        served.edge.url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers
    ) as r:
        assert r.status == 200, await r.text()
        yield r


def chosen(response: aiohttp.ClientResponse) -> str:
    return response.headers["x-nearshore-route"].split(" score=")[0]


async def drain(response: aiohttp.ClientResponse) -> list[bytes]:
    return [data async for data in iter_data(response.content)]


async def statuses(served: Served) -> dict[str, str]:
    """Each replica's status as the edge's /health shows it."""
    async with aiohttp.ClientSession() as s, s.get(served.edge.metrics_url + "/health") as r:
        return (await r.json())["regions"]


async def until(check, timeout_s: float, what: str, pause_s: float = 0.1):
    """Call ``check`` (a coroutine function) until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout_s:g}s: {what}"
        await asyncio.sleep(pause_s)


# --- where the client is, and where that sends it -----------------------------------------------------------


async def test_a_lagos_client_goes_to_the_lowest_expected_ttft_region(geo_edge: Served) -> None:
    async with client(geo_edge) as s:
        answer = await ask(s, geo_edge, LAGOS)
    assert answer.status == 200 and answer.region == "london" and answer.chosen == "london"
    # Measured on loopback, London's round trip is below light's: the floor from the catalog stands in.
    assert f"rtt={floor_rtt_ms('lagos', 'london'):.1f}" in answer.route
    assert "runner-up dublin" in answer.route  # 5,287 km to London's 5,020; Virginia is third


async def test_a_virginia_client_through_the_trusted_proxy_goes_to_virginia(geo_edge: Served) -> None:
    async with client(geo_edge) as s:
        answer = await ask(s, geo_edge, VIRGINIA)
        # Also behind a chain of trusted hops: read from the right, the first untrusted one is the client.
        chained = await ask(s, geo_edge, f"{VIRGINIA}, 127.0.0.1")
    assert (answer.status, answer.region, answer.chosen) == (200, "virginia", "virginia")
    assert (chained.status, chained.region) == (200, "virginia")


async def test_an_untrusted_peers_forwarded_for_is_ignored(geo_edge: Served) -> None:
    async with client(geo_edge, from_address="127.0.0.2") as s:
        answer = await ask(s, geo_edge, VIRGINIA)
    # Placed where the edge is (loopback peer), not in Virginia: London, with no client term.
    assert (answer.status, answer.region) == (200, "london")
    assert " client=0.0 " in answer.route


async def test_a_malformed_forwarded_for_is_ignored_and_the_edge_keeps_serving(geo_edge: Served) -> None:
    malformed = [
        "not-an-address",
        f"{VIRGINIA}, bogus",  # the walk from the right stops at the bad entry: the trusted peer stands in
        "999.1.1.1",
        f"{VIRGINIA}:443",
        " , ,, ",
        "\u00e9\u00e9.1.1.1",
        "1." * 3000,  # over the 4 KiB bound: not read at all
    ]
    async with client(geo_edge) as s:
        for forwarded_for in malformed:
            answer = await ask(s, geo_edge, forwarded_for)
            assert (answer.status, answer.region) == (200, "london"), (forwarded_for, answer)
            assert " client=0.0 " in answer.route, forwarded_for
        assert (await ask(s, geo_edge, VIRGINIA)).region == "virginia"


async def test_the_written_database_is_the_one_read(written: Served) -> None:
    async with client(written) as s:
        answer = await ask(s, written, ONLY_IN_WRITTEN)
    assert answer.region == "london"  # GeoLite2 would have placed it in the US, and sent it to Virginia


async def test_residency_keeps_an_eu_client_in_the_eu(geo_edge: Served) -> None:
    async with client(geo_edge) as s:
        for address in (LONDON, FRANKFURT):
            answer = await ask(s, geo_edge, address)
            assert answer.status == 200 and answer.region in EU, (address, answer)
            assert "policy=eu-only" in answer.route
        lagos = await ask(s, geo_edge, LAGOS)
    assert "policy=" not in lagos.route  # no policy covers a Nigerian client


# --- health: loading, killed, recovered ---------------------------------------------------------------------


async def test_a_loading_replica_is_skipped_unless_it_is_the_only_one(pool: Pool) -> None:
    served = pool.served
    edge = served.edge
    staging = edge.new_key(rpm=10**6, tpm=10**9, tenant="staging-team", debug=True)
    solo = edge.new_key(rpm=10**6, tpm=10**9, tenant="solo-team", debug=True)
    health = await statuses(served)
    assert health["staging/0"] == "loading" and health["staging/1"] == "up" and health["solo"] == "loading"
    async with client(served) as s:
        # staging/0 is first in the catalog, but loading while staging/1 can serve
        beside = [await ask(s, served, key=staging) for _ in range(3)]
        alone = await ask(s, served, key=solo)
    assert all((a.status, a.region, a.chosen) == (200, "staging", "staging/1") for a in beside), beside
    assert "staging/0" not in beside[0].route  # not even the runner-up
    assert (alone.status, alone.region, alone.chosen) == (200, "solo", "solo")


async def test_a_long_shared_prefix_sticks_to_one_replica_until_it_is_overloaded(pool: Pool) -> None:
    served = pool.served
    async with client(served) as s:
        # A stream in flight at pool/0 (1 s) makes pool/1 the least loaded when the document first comes.
        async with open_stream(s, served, "hi", max_tokens=40) as first:
            assert chosen(first) == "pool/0"
            assert (await ask(s, served, content=DOCUMENT + "Who routes?")).chosen == "pool/1"
            assert (await drain(first))[-1] == b"[DONE]"
        # All idle again: a prompt without the document goes to the first replica, as before ...
        assert (await ask(s, served)).chosen == "pool/0"
        # ... and the document's questions follow its KV cache to pool/1.
        for n in range(3):
            answer = await ask(s, served, content=DOCUMENT + f"Question {n}?")
            assert answer.chosen == "pool/1" and "affinity" in answer.route, answer
        # Slow streams of the document pile up on pool/1 until it holds 3 more than the others: then spread.
        picks: list[str] = []
        async with contextlib.AsyncExitStack() as streams:
            for n in range(6):
                response = await streams.enter_async_context(
                    open_stream(s, served, DOCUMENT + f"Long answer {n}", max_tokens=200)
                )
                picks.append(chosen(response))
    assert picks[:3] == ["pool/1"] * 3, picks
    assert picks[3] != "pool/1" and set(picks) == {"pool/0", "pool/1", "pool/2"}, picks


async def test_a_killed_replica_is_ejected_and_returns_after_restart(
    written: Served, geo_pacers: dict[str, Pacer]
) -> None:
    london = geo_pacers["london"]

    async def all_up() -> bool:  # (a test before it may have killed and restarted some)
        return all(state == "up" for state in (await statuses(written)).values())

    await until(all_up, 10.0, "every region up")
    async with client(written) as s:

        async def at_london() -> bool:  # (traffic a test before it moved away comes back after the hold)
            return (await ask(s, written, LAGOS)).region == "london"

        await until(at_london, 10.0, "London serves the Lagos client")
        kill(london)
        try:
            # Each request finds London refusing connections and fails over to the runner-up, at once.
            moved = [await ask(s, written, LAGOS) for _ in range(3)]
            assert all((a.status, a.region) == (200, "dublin") for a in moved), moved
            assert all(a.elapsed_s < 5.0 for a in moved), moved  # not after a timeout
            # Three connect failures in a row eject it (before the probes, 3 s, could take it down).
            assert (await statuses(written))["london"].startswith("ejected"), await statuses(written)
            after = await ask(s, written, LAGOS)
            assert (after.region, after.chosen) == ("dublin", "dublin")  # no longer tried first
        finally:
            restart(london)

        # Back on the same port: once its ejection ends and it wins by the margin for hold_s, it returns.
        async def back() -> bool:
            return (await ask(s, written, LAGOS)).region == "london"

        await until(back, 10.0, "London serves the Lagos client again")
    assert (await statuses(written))["london"] == "up"


async def test_with_the_eu_down_an_eu_client_gets_a_503_naming_the_policy_at_once(
    written: Served, geo_pacers: dict[str, Pacer]
) -> None:
    eu_pacers = [geo_pacers[name] for name in sorted(EU)]
    async with client(written) as s:
        for pacer in eu_pacers:
            kill(pacer)
        try:

            async def eu_down() -> bool:
                health = await statuses(written)
                return all(health[name].startswith("down") for name in EU)

            # The probes take them down (three failures a second apart); an ejection would end sooner.
            await until(eu_down, 10.0, "the EU regions are down")
            answers = [await ask(s, written, address) for address in (LONDON, FRANKFURT)]
            for answer in answers:
                assert answer.status == 503 and answer.error["code"] == "residency_unavailable", answer
                assert "eu-only" in answer.error["message"] and answer.region not in EU
                assert answer.elapsed_s < 5.0, answer  # at once, not after a timeout
            # Everyone else is still served, by what is left.
            lagos, virginia = await ask(s, written, LAGOS), await ask(s, written, VIRGINIA)
            assert (lagos.status, lagos.region) == (200, "virginia")
            assert (virginia.status, virginia.region) == (200, "virginia")
        finally:
            for pacer in eu_pacers:
                restart(pacer)

        async def eu_back() -> bool:
            answer = await ask(s, written, LONDON)
            return answer.status == 200 and answer.region in EU

        await until(eu_back, 10.0, "the EU client is served in the EU again")
