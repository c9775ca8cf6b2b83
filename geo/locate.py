"""Where the client is: its address (the socket peer, or X-Forwarded-For behind trusted proxies) and that
address's place in a MaxMind-format GeoIP database (GeoLite2/GeoIP2 City or Country, DB-IP lite).

The request path stays in microseconds: addresses are checked with ``inet_pton`` (C, strict) rather than
``ipaddress``'s string parser, the database is read through maxminddb's C reader over a memory map (geoip2's
model objects cost ~15x more per lookup), and results sit in an LRU per address string. Nothing here raises
on what a client sends: a bad address resolves to the edge's own location.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import socket
from collections.abc import Sequence
from typing import Any, Literal

import maxminddb
import msgspec

log = logging.getLogger("nearshore.geo")

MAX_FORWARDED_FOR_CHARS = 4096  # a longer X-Forwarded-For is ignored whole
MAX_FORWARDED_HOPS = 32  # at most this many entries are read, from the right
_MAX_ADDRESS_CHARS = 45  # the longest text form of an IPv6 address ("ffff:...:255.255.255.255")
_MAPPED_PREFIX = bytes(10) + b"\xff\xff"  # ::ffff:0:0/96, IPv4-mapped IPv6
_MAPPED_NETWORK = ipaddress.IPv6Network("::ffff:0:0/96")
# Probed once at open: a corrupt search tree fails on any of them, so it fails at start-up, not per request.
_PROBE_ADDRESSES = ("1.1.1.1", "8.8.8.8", "105.112.1.1", "81.2.69.160", "2001:4860::1", "2a02:c7f::1")
# The kinds of database that carry a country or a location; an ASN or ISP database would place nobody.
_PLACE_KINDS = ("city", "country", "enterprise", "location")

Source = Literal["geoip", "edge"]
_Parsed = tuple[int, int, str]  # (IP version, address as an integer, canonical text)


class Location(msgspec.Struct, frozen=True):
    """A place. ``source`` says whether the database placed the client ("geoip") or the edge's own location
    stood in for it ("edge": a private, loopback, reserved, unparsable or unlisted address)."""

    latitude: float  # degrees, north positive
    longitude: float  # degrees, east positive
    country: str = ""  # ISO 3166-1 alpha-2; "" unknown
    continent: str = ""  # two-letter continent code (AF, EU, NA, ...); "" unknown
    city: str = ""  # English name; "" unknown
    source: Source = "edge"


class GeoDatabaseError(Exception):
    """The configured GeoIP database cannot be used; the message names the file."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"GeoIP database {path!r}: {reason}")
        self.path = path
        self.reason = reason


def embedded_database_path() -> str:
    """The GeoLite2 City file shipped in the ``maxminddb-geolite2`` package (the ``edge`` extra)."""
    try:
        import _maxminddb_geolite2
    except ImportError as exc:
        raise GeoDatabaseError(
            "<embedded GeoLite2 City>",
            "the package maxminddb-geolite2 is not installed (pip install .[edge])",
        ) from exc
    return str(_maxminddb_geolite2.geolite2_database())


def parse_address(text: str) -> _Parsed | None:
    """``text`` as (version, integer, canonical text), or None unless it is a bare IPv4 or IPv6 address
    (no port, brackets, zone or whitespace). IPv4-mapped IPv6 (::ffff:1.2.3.4) becomes the IPv4 address."""
    try:
        if ":" not in text:
            packed = socket.inet_pton(socket.AF_INET, text)
            return 4, int.from_bytes(packed), text  # inet_pton took only the canonical dotted quad
        packed = socket.inet_pton(socket.AF_INET6, text)
    except (OSError, ValueError):  # ValueError: a NUL or a character that is not ASCII
        return None
    if packed[:12] == _MAPPED_PREFIX:
        return 4, int.from_bytes(packed[12:]), socket.inet_ntop(socket.AF_INET, packed[12:])
    return 6, int.from_bytes(packed), socket.inet_ntop(socket.AF_INET6, packed)


class TrustedProxies:
    """The CIDRs whose X-Forwarded-For is believed, as (network, mask) integers per IP version."""

    def __init__(self, cidrs: Sequence[str]) -> None:
        self._networks: dict[int, list[tuple[int, int]]] = {4: [], 6: []}
        for cidr in cidrs:
            try:
                network = ipaddress.ip_network(cidr.strip(), strict=False)
            except (ValueError, TypeError, AttributeError) as exc:
                raise ValueError(f"trusted_proxies: {cidr!r} is not an IP network (CIDR)") from exc
            if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED_NETWORK):
                # addresses are compared in IPv4 form once unmapped: so are such networks
                mapped = network.network_address.ipv4_mapped
                network = ipaddress.IPv4Network((str(mapped), network.prefixlen - 96))
            self._networks[network.version].append((int(network.network_address), int(network.netmask)))

    def __bool__(self) -> bool:
        return bool(self._networks[4] or self._networks[6])

    def __contains__(self, address: _Parsed) -> bool:
        version, value, _ = address
        return any(value & mask == network for network, mask in self._networks[version])

    def client_address(self, peer: str | None, forwarded_for: str | None) -> str | None:
        """The socket peer, or behind a trusted peer the first untrusted X-Forwarded-For entry from the
        right. A malformed entry ends the walk (what is left of it may be forged): the furthest trusted hop
        stands in, as when every entry is trusted. An untrusted peer's header, an over-long header and
        entries past the 32nd are never read."""
        peer_address = parse_address(peer) if peer else None
        if peer_address is None:
            return None
        if not forwarded_for or len(forwarded_for) > MAX_FORWARDED_FOR_CHARS or peer_address not in self:
            return peer_address[2]
        furthest = peer_address
        entries = forwarded_for.rsplit(",", MAX_FORWARDED_HOPS)[-MAX_FORWARDED_HOPS:]
        for entry in reversed(entries):
            hop = parse_address(entry.strip(" \t"))
            if hop is None:
                return furthest[2]
            if hop not in self:
                return hop[2]
            furthest = hop
        return furthest[2]


class Locator:
    """Client addresses and their locations over one memory-mapped GeoIP database, with an LRU of results."""

    def __init__(
        self,
        database: str | None,
        edge_location: Location,
        trusted_proxies: Sequence[str] = (),
        cache_size: int = 65536,
        fallback_to_embedded: bool = False,
    ) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, not {cache_size}")
        self.edge_location = msgspec.structs.replace(edge_location, source="edge")
        self.trusted_proxies = TrustedProxies(trusted_proxies)
        self.database_path, self._reader = _open_with_fallback(database, fallback_to_embedded)
        metadata = self._reader.metadata()
        self.database_type: str = metadata.database_type
        self.database_built_epoch_s: int = metadata.build_epoch
        self.cache_size = cache_size
        # One C-implemented LRU per locator: a hit costs a dict probe, not a tree walk.
        self._cached = functools.lru_cache(maxsize=cache_size)(self._lookup)

    def client_address(self, peer: str | None, forwarded_for: str | None) -> str | None:
        """See :meth:`TrustedProxies.client_address`."""
        return self.trusted_proxies.client_address(peer, forwarded_for)

    def locate(self, address: str | None) -> Location:
        """Where ``address`` is; the edge's own location for anything the database cannot place."""
        if not address or len(address) > _MAX_ADDRESS_CHARS:
            return self.edge_location  # never an address: not worth a cache slot
        return self._cached(address)

    @property
    def cache_entries(self) -> int:
        return self._cached.cache_info().currsize

    @property
    def cache_hits(self) -> int:
        return self._cached.cache_info().hits

    def clear_cache(self) -> None:
        self._cached.cache_clear()

    def close(self) -> None:
        self.clear_cache()
        self._reader.close()

    def __enter__(self) -> Locator:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _lookup(self, address: str) -> Location:
        parsed = parse_address(address)
        if parsed is None or not _is_public(parsed):
            return self.edge_location
        try:
            record = self._reader.get(parsed[2])
        except Exception:  # a corrupt region of the file, or an IPv6 address in an IPv4-only database
            log.debug("GeoIP lookup of %s failed", parsed[2], exc_info=True)
            return self.edge_location
        return _location_of(record, self.edge_location)


def _is_public(address: _Parsed) -> bool:
    """Whether the address can have a place: not private, loopback, link-local, reserved or multicast."""
    version, value, _ = address
    ip = ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value)
    return ip.is_global and not ip.is_multicast


def _location_of(record: Any, edge: Location) -> Location:
    """The Location in a GeoLite2/GeoIP2/DB-IP record. A record with a country but no coordinates (a Country
    database) keeps the edge's coordinates: distances then stay those of the edge, the best guess left."""
    if not isinstance(record, dict):
        return edge
    country = _text(record, "country", "iso_code")
    latitude, longitude = _coordinates(record.get("location"))
    if latitude is None or longitude is None:
        if not country:
            return edge
        latitude, longitude = edge.latitude, edge.longitude
    return Location(
        latitude=latitude,
        longitude=longitude,
        country=country,
        continent=_text(record, "continent", "code"),
        city=_english_name(record.get("city")),
        source="geoip",
    )


def _text(record: dict[str, Any], section: str, field: str) -> str:
    part = record.get(section)
    value = part.get(field) if isinstance(part, dict) else None
    return value if isinstance(value, str) else ""


def _english_name(section: Any) -> str:
    names = section.get("names") if isinstance(section, dict) else None
    name = names.get("en") if isinstance(names, dict) else None
    return name if isinstance(name, str) else ""


def _coordinates(section: Any) -> tuple[float | None, float | None]:
    if not isinstance(section, dict):
        return None, None
    latitude, longitude = section.get("latitude"), section.get("longitude")
    if not isinstance(latitude, int | float) or not isinstance(longitude, int | float):
        return None, None
    if not (math.isfinite(latitude) and math.isfinite(longitude)):
        return None, None
    if abs(latitude) > 90 or abs(longitude) > 180:
        return None, None
    return float(latitude), float(longitude)


def _open_with_fallback(database: str | None, fallback_to_embedded: bool) -> tuple[str, Any]:
    """(path, reader) of the configured database, or of the embedded one when so configured."""
    if not database:
        path = embedded_database_path()
        return path, open_database(path)
    try:
        return database, open_database(database)
    except GeoDatabaseError as exc:
        if not fallback_to_embedded:
            raise
        log.warning("%s; using the embedded GeoLite2 City database instead", exc)
        path = embedded_database_path()
        return path, open_database(path)


def open_database(path: str) -> Any:
    """A memory-mapped maxminddb reader over ``path``, checked to be a MaxMind database that places clients
    and whose search tree answers; GeoDatabaseError naming the path otherwise."""
    try:
        reader = maxminddb.open_database(path, _mode())
    except FileNotFoundError as exc:
        raise GeoDatabaseError(path, "no such file") from exc
    except OSError as exc:
        raise GeoDatabaseError(path, f"cannot be read ({exc.strerror or exc})") from exc
    except (maxminddb.InvalidDatabaseError, ValueError, TypeError) as exc:
        raise GeoDatabaseError(path, "not a MaxMind DB file (or a corrupt one)") from exc
    try:
        _check(reader, path)
    except BaseException:
        reader.close()
        raise
    return reader


def _mode() -> int:
    # The C extension reads from the mmap without building Python objects per node; the pure-Python
    # reader (a wheel-less platform) is the same interface, only slower.
    try:
        import maxminddb.extension
    except ImportError:
        return maxminddb.MODE_MMAP
    return maxminddb.MODE_MMAP_EXT


def _check(reader: Any, path: str) -> None:
    metadata = reader.metadata()
    kind = str(metadata.database_type)
    if not any(word in kind.lower() for word in _PLACE_KINDS):
        raise GeoDatabaseError(path, f"a {kind!r} database has no locations; use a City or Country database")
    for address in _PROBE_ADDRESSES:
        if metadata.ip_version == 4 and ":" in address:
            continue
        try:
            reader.get(address)
        except Exception as exc:
            raise GeoDatabaseError(path, f"corrupt: looking up {address} failed ({exc})") from exc
