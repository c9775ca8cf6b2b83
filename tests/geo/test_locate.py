"""Where the client is (geo/locate.py): the embedded GeoLite2 City, a database written for the test, the
client address behind trusted proxies, bad databases and the LRU's bound."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from geo.locate import (
    MAX_FORWARDED_FOR_CHARS,
    MAX_FORWARDED_HOPS,
    GeoDatabaseError,
    Location,
    Locator,
    embedded_database_path,
)
from tests.geoip_db import write_test_db

# The edge stands in Accra, so that its own location is never mistaken for a Lagos client's.
EDGE = Location(latitude=5.56, longitude=-0.2, country="GH", continent="AF", city="Accra")
TRUSTED = ["10.0.0.0/8", "203.0.113.7", "fd00::/8"]
PLACES = {
    "105.112.0.0/16": {"country": "NG", "continent": "AF", "city": "Lagos", "lat": 6.45, "lon": 3.39},
    "41.90.0.0/16": {"country": "KE", "continent": "AF", "city": "Nairobi", "lat": -1.28, "lon": 36.82},
    "3.0.0.0/8": {"country": "US", "continent": "NA", "city": "Ashburn", "lat": 39.04, "lon": -77.49},
    "2a01:4f8::/32": {"country": "DE", "continent": "EU", "city": "Frankfurt", "lat": 50.11, "lon": 8.68},
    "20.0.0.0/8": {"country": "FR", "continent": "EU"},  # a Country-shaped record: no city, no coordinates
    "10.0.0.0/8": {"country": "XX", "city": "Nowhere", "lat": 1.0, "lon": 1.0},  # private: never read
}


@pytest.fixture(scope="module")
def test_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_test_db(tmp_path_factory.mktemp("geoip") / "test-city.mmdb", PLACES)


@pytest.fixture(scope="module")
def written(test_db: Path) -> Iterator[Locator]:
    with Locator(str(test_db), EDGE, TRUSTED) as locator:
        yield locator


@pytest.fixture(scope="module")
def embedded() -> Iterator[Locator]:
    with Locator(None, EDGE, TRUSTED) as locator:
        yield locator


# --- the embedded GeoLite2 City ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "country", "city", "latitude", "longitude"),
    [
        ("105.112.1.1", "NG", "Lagos", 6.45, 3.40),
        ("41.58.1.1", "NG", "Lagos", 6.45, 3.40),
        ("54.239.0.1", "US", "Ashburn", 39.05, -77.47),  # Ashburn, Virginia
        ("18.130.0.1", "GB", "London", 51.51, -0.09),
        ("::ffff:105.112.1.1", "NG", "Lagos", 6.45, 3.40),  # IPv4-mapped IPv6, as a dual-stack socket says it
    ],
)
def test_embedded_geolite2_places_lagos_virginia_and_london(
    embedded: Locator, address: str, country: str, city: str, latitude: float, longitude: float
) -> None:
    where = embedded.locate(address)
    assert (where.country, where.city, where.source) == (country, city, "geoip")
    assert where.latitude == pytest.approx(latitude, abs=0.01)
    assert where.longitude == pytest.approx(longitude, abs=0.01)


def test_embedded_database_is_the_default(embedded: Locator) -> None:
    assert embedded.database_path == embedded_database_path()
    assert embedded.database_type == "GeoLite2-City"
    with Locator("", EDGE) as by_empty_string:
        assert by_empty_string.locate("18.130.0.1").city == "London"


def test_embedded_ipv6_has_a_country(embedded: Locator) -> None:
    where = embedded.locate("2001:4860::1")
    assert (where.country, where.continent, where.source) == ("US", "NA", "geoip")


# --- a database written for the test ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "cidr"),
    [
        ("105.112.200.9", "105.112.0.0/16"),
        ("41.90.0.1", "41.90.0.0/16"),
        ("3.255.1.1", "3.0.0.0/8"),
        ("2a01:4f8:1:2::3", "2a01:4f8::/32"),
        ("2A01:04F8:0:0::1", "2a01:4f8::/32"),  # any text form of the same IPv6 address
        ("::ffff:3.1.2.3", "3.0.0.0/8"),
    ],
)
def test_written_database_gives_what_was_written(written: Locator, address: str, cidr: str) -> None:
    place = PLACES[cidr]
    assert written.locate(address) == Location(
        latitude=place["lat"],
        longitude=place["lon"],
        country=place["country"],
        continent=place["continent"],
        city=place["city"],
        source="geoip",
    )


def test_country_only_record_keeps_the_edge_coordinates(written: Locator) -> None:
    assert written.locate("20.1.2.3") == Location(
        latitude=EDGE.latitude, longitude=EDGE.longitude, country="FR", continent="EU", source="geoip"
    )


@pytest.mark.parametrize(
    "address",
    [
        "10.1.2.3",  # private, even though the database lists it
        "192.168.1.10",
        "172.16.0.1",
        "127.0.0.1",
        "169.254.1.1",  # link-local
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "240.0.0.1",  # reserved
        "255.255.255.255",
        "224.0.0.251",  # multicast
        "192.0.2.1",  # documentation
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "2001:db8::1",
        "::ffff:127.0.0.1",
        "8.8.8.8",  # public, not in the written database
        "2c0f:f7a8::1",
        "not an address",
        "1.2.3.4:443",
        "[2a01:4f8::1]",
        "105.112.1.1 ",
        "105.112.01.1",
        "fe80::1%eth0",
        "１０５.112.1.1",  # fullwidth digits
        "105.112.1.1\x00",
        "",
        None,
        "2a01:4f8::1" * 1000,
    ],
)
def test_unplaceable_addresses_get_the_edge_location(written: Locator, address: str | None) -> None:
    assert written.locate(address) == msgspec.structs.replace(EDGE, source="edge")


def test_a_record_that_fails_to_decode_gets_the_edge_location(tmp_path: Path) -> None:
    """A flaw in one record's data, past the checks at open, is an answer (the edge's place), not a raise."""
    good = write_test_db(tmp_path / "good.mmdb", {k: PLACES[k] for k in ("105.112.0.0/16", "3.0.0.0/8")})
    data = bytearray(good.read_bytes())
    data[data.index(b"Ashburn") - 1] = 0x00  # the string's control byte now names a type that does not exist
    flawed = tmp_path / "flawed.mmdb"
    flawed.write_bytes(data)
    with Locator(str(flawed), EDGE) as locator:
        assert locator.locate("3.1.1.1").source == "edge"
        assert locator.locate("105.112.1.1").city == "Lagos"


def test_edge_location_is_always_marked_edge() -> None:
    with Locator(None, msgspec.structs.replace(EDGE, source="geoip"), ()) as locator:
        assert locator.locate("127.0.0.1").source == "edge"
    with pytest.raises(AttributeError):
        EDGE.city = "Lagos"  # type: ignore[misc]


# --- the client's address ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "client"),
    [
        # no proxy: the socket peer, whatever the client claims
        ("105.112.1.1", None, "105.112.1.1"),
        ("105.112.1.1", "54.239.0.1", "105.112.1.1"),
        ("198.51.100.9", "10.0.0.1, 54.239.0.1", "198.51.100.9"),
        # one trusted proxy
        ("10.0.0.1", "54.239.0.1", "54.239.0.1"),
        ("203.0.113.7", "54.239.0.1", "54.239.0.1"),  # a single trusted address, not a network
        ("10.0.0.1", "", "10.0.0.1"),
        ("10.0.0.1", None, "10.0.0.1"),
        # a chain of trusted proxies, read right to left; what the client wrote itself is left of its hop
        ("10.0.0.3", "54.239.0.1, 10.0.0.2, 10.0.0.1", "54.239.0.1"),
        ("10.0.0.3", "1.1.1.1, 54.239.0.1, 10.0.0.1", "54.239.0.1"),
        ("10.0.0.3", "1.1.1.1,54.239.0.1 ,\t10.0.0.1", "54.239.0.1"),
        ("10.0.0.3", "1.1.1.1, 105.112.1.1, 10.0.0.1", "105.112.1.1"),  # headers joined by ", "
        # every valid hop trusted: the furthest is the client
        ("10.0.0.3", "10.0.0.2, 10.0.0.1", "10.0.0.2"),
        # a malformed entry ends the walk: what lies left of it may be forged, the last trusted hop stands in
        ("10.0.0.1", "54.239.0.1, garbage", "10.0.0.1"),
        ("10.0.0.1", "54.239.0.1, unknown, 10.0.0.2", "10.0.0.2"),
        ("10.0.0.1", "54.239.0.1:443", "10.0.0.1"),
        ("10.0.0.1", "[2a01:4f8::1]", "10.0.0.1"),
        ("10.0.0.1", "[2a01:4f8::1]:443, 10.0.0.2", "10.0.0.2"),
        ("10.0.0.1", ",,, ,", "10.0.0.1"),
        ("10.0.0.1", "54.239.0.1\x00", "10.0.0.1"),
        ("10.0.0.1", "٥٤.239.0.1", "10.0.0.1"),  # Arabic-Indic digits
        ("10.0.0.1", "999.1.1.1, 1.2.3", "10.0.0.1"),
        # IPv6: trusted IPv6 proxies, IPv6 clients, IPv4-mapped forms of both
        ("fd00::5", "2a01:4f8::1", "2a01:4f8::1"),
        ("fd00::5", "2A01:04F8:0::1", "2a01:4f8::1"),  # answered in canonical form
        ("::ffff:10.0.0.5", "54.239.0.1", "54.239.0.1"),  # a dual-stack socket's view of a v4 proxy
        ("10.0.0.1", "::ffff:105.112.1.1", "105.112.1.1"),
        ("10.0.0.1", "2a01:4f8::1, ::ffff:10.0.0.9", "2a01:4f8::1"),
        ("2a01:4f8::1", "54.239.0.1", "2a01:4f8::1"),
        ("::ffff:105.112.1.1", None, "105.112.1.1"),
        # no usable peer: no address at all, and the header is not believed
        (None, "54.239.0.1", None),
        ("", "54.239.0.1", None),
        ("not-an-ip", "54.239.0.1", None),
        ("10.0.0.1:5555", "54.239.0.1", None),
    ],
)
def test_client_address(
    written: Locator, peer: str | None, forwarded_for: str | None, client: str | None
) -> None:
    assert written.client_address(peer, forwarded_for) == client


def test_a_forwarded_client_is_located_through_the_trusted_proxy(written: Locator) -> None:
    client = written.client_address("10.0.0.1", "6.6.6.6, 3.4.5.6, 10.0.0.2")
    assert written.locate(client).city == "Ashburn"
    spoofed = written.client_address("3.4.5.6", "105.112.1.1")  # an untrusted peer claiming to be in Lagos
    assert written.locate(spoofed).city == "Ashburn"


def test_an_over_long_forwarded_for_is_ignored(written: Locator) -> None:
    padding = "x" * (MAX_FORWARDED_FOR_CHARS - len(", 54.239.0.1"))
    at_limit = padding + ", 54.239.0.1"
    assert len(at_limit) == MAX_FORWARDED_FOR_CHARS
    assert written.client_address("10.0.0.1", at_limit) == "54.239.0.1"
    assert written.client_address("10.0.0.1", "x" + at_limit) == "10.0.0.1"


def test_only_the_last_32_hops_are_read(written: Locator) -> None:
    proxies = [f"10.0.1.{n}" for n in range(MAX_FORWARDED_HOPS)]
    assert written.client_address("10.0.0.1", ", ".join(["54.239.0.1", *proxies[1:]])) == "54.239.0.1"
    # one hop too far: the client is never reached, the furthest trusted hop read stands in
    assert written.client_address("10.0.0.1", ", ".join(["54.239.0.1", *proxies])) == proxies[0]
    # a client's own junk to the left of its hop costs nothing
    assert written.client_address("10.0.0.1", "junk, " * 300 + "54.239.0.1, 10.0.0.2") == "54.239.0.1"


def test_a_trusted_proxy_that_is_not_a_cidr_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("10.0.0.0/33")):
        Locator(None, EDGE, ["10.0.0.0/33"])


def test_a_trusted_network_written_in_ipv4_mapped_form_trusts_its_ipv4_peers() -> None:
    with Locator(None, EDGE, ["::ffff:192.0.2.0/120"]) as locator:
        assert locator.client_address("192.0.2.9", "54.239.0.1") == "54.239.0.1"
        assert locator.client_address("::ffff:192.0.2.9", "54.239.0.1") == "54.239.0.1"
        assert locator.client_address("192.0.3.9", "54.239.0.1") == "192.0.3.9"


def test_without_trusted_proxies_no_forwarded_for_is_believed() -> None:
    with Locator(None, EDGE) as locator:
        assert locator.client_address("10.0.0.1", "54.239.0.1") == "10.0.0.1"


# --- bad databases ----------------------------------------------------------------------------------------


def _bad_files(folder: Path, test_db: Path) -> dict[str, Path]:
    data = test_db.read_bytes()
    files = {
        "missing": folder / "missing.mmdb",
        "text": folder / "notes.txt",
        "empty": folder / "empty.mmdb",
        "truncated": folder / "truncated.mmdb",
        "corrupt tree": folder / "corrupt.mmdb",
        "a directory": folder / "a-directory.mmdb",
        "an ASN database": folder / "asn.mmdb",
    }
    files["text"].write_text("105.112.0.0/16,NG,Lagos\n" * 100)
    files["empty"].write_bytes(b"")
    files["truncated"].write_bytes(data[: len(data) // 2])
    files["corrupt tree"].write_bytes(b"\xff" * 600 + data[600:])  # the search tree's pointers lead nowhere
    files["a directory"].mkdir()
    write_test_db(files["an ASN database"], PLACES, database_type="GeoLite2-ASN")
    return files


@pytest.mark.parametrize(
    "kind", ["missing", "text", "empty", "truncated", "corrupt tree", "a directory", "an ASN database"]
)
def test_a_bad_database_is_an_error_naming_its_path(tmp_path: Path, test_db: Path, kind: str) -> None:
    path = _bad_files(tmp_path, test_db)[kind]
    with pytest.raises(GeoDatabaseError) as raised:
        Locator(str(path), EDGE)
    assert str(path) in str(raised.value)
    assert raised.value.path == str(path)


def test_a_bad_database_falls_back_to_the_embedded_one_when_asked(
    tmp_path: Path, test_db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    corrupt = _bad_files(tmp_path, test_db)["corrupt tree"]
    with caplog.at_level(logging.WARNING, logger="nearshore.geo"):
        locator = Locator(str(corrupt), EDGE, fallback_to_embedded=True)
    with locator:
        assert locator.database_path == embedded_database_path()
        assert locator.locate("105.112.1.1").city == "Lagos"
    assert str(corrupt) in caplog.text


# --- the LRU ----------------------------------------------------------------------------------------------


def test_the_lru_holds_at_most_cache_size_results(test_db: Path) -> None:
    with Locator(str(test_db), EDGE, cache_size=8) as locator:
        for n in range(100):
            assert locator.locate(f"105.112.{n}.1").city == "Lagos"
        assert locator.cache_entries == 8
        locator.locate("105.112.99.1")  # the most recent: still held
        assert locator.cache_hits == 1
        locator.locate("2a01:4f8::1" * 10)  # never an address: answered without a slot
        assert locator.cache_entries == 8


def test_no_cache_still_answers(test_db: Path) -> None:
    with Locator(str(test_db), EDGE, cache_size=0) as locator:
        assert locator.locate("41.90.1.1").city == locator.locate("41.90.1.1").city == "Nairobi"
        assert locator.cache_entries == 0
