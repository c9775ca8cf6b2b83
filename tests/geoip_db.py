"""Write a small MaxMind DB for tests, shaped like GeoLite2 City, so that a test can put a client anywhere.

    write_test_db(path, {"105.112.0.0/16": {"country": "NG", "continent": "AF", "city": "Lagos",
                                            "lat": 6.45, "lon": 3.39}})

Every field of a place is optional (a Country-shaped record has no "city", "lat" or "lon"). The database is
IPv6 with the IPv4 space at ::/96, as MaxMind's own are, so IPv4 and IPv6 networks can sit side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mmdb_writer import MmdbF64, MMDBWriter
from netaddr import IPSet


def geolite2_record(place: Mapping[str, Any]) -> dict[str, Any]:
    """The GeoLite2 City record for ``place`` (keys country, continent, city, lat, lon; all optional)."""
    record: dict[str, Any] = {}
    if "city" in place:
        record["city"] = {"names": {"en": place["city"]}}
    if "continent" in place:
        record["continent"] = {"code": place["continent"]}
    if "country" in place:
        record["country"] = {"iso_code": place["country"]}
    if "lat" in place and "lon" in place:
        # MaxMind stores coordinates as doubles; say so, so that a whole number is not written as an int.
        record["location"] = {"latitude": MmdbF64(place["lat"]), "longitude": MmdbF64(place["lon"])}
    return record


def write_test_db(
    path: str | Path,
    places: Mapping[str, Mapping[str, Any]],
    database_type: str = "GeoLite2-City",
) -> Path:
    """Write ``places`` ({cidr: place}) as a MaxMind DB at ``path`` and return the path."""
    writer = MMDBWriter(
        ip_version=6,
        ipv4_compatible=True,
        database_type=database_type,
        languages=["en"],
        description="Nearshore test database",
    )
    for cidr, place in places.items():
        writer.insert_network(IPSet([cidr]), geolite2_record(place))
    writer.to_db_file(str(path))
    return Path(path)
