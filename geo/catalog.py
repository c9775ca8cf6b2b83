"""The region catalog and the routing settings, as an edge's config file gives them.

A region is a place (a city from ``configs/cities.toml``, or coordinates and a country) with one or more
replica URLs, the models it serves, its pool class and how many requests this edge may have in flight there.
:func:`check_catalog` finds what the types cannot: duplicates, unknown cities, policies naming regions that do
not exist; each message names the key, so the edge can refuse to start with the file and key in it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field
from msgspec.structs import replace

from geo.places import Latitude, Longitude, cities

PoolClass = Literal["large", "small", "embedding"]
Url = Annotated[str, Meta(pattern=r"^https?://[^\s]+$")]
Name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
Code = Annotated[str, Meta(pattern=r"^[A-Z]{2}$")]


HeaderName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]


class ProviderSpec(Struct, forbid_unknown_fields=True, kw_only=True):
    """An OpenAI-compatible provider in a region's place (a hosted API, a partner's vLLM or llama.cpp
    server): how the edge authenticates to it and what it calls the edge's models (edge/provider.py). Its
    URL's path is the prefix of every path asked there (``https://api.example.com/openai``)."""

    # The credential, from this environment variable or this file (re-read when the file changes); never
    # from the config's text. Neither: the provider takes requests without one.
    api_key_env: Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    api_key_file: str | None = None
    # Authorization carries "Bearer <key>"; any other header (api-key, x-api-key) carries the key itself.
    header: HeaderName = "Authorization"
    # The provider's own id for each of the edge's model names it serves (a name not listed: the same).
    models: dict[str, Annotated[str, Meta(min_length=1, max_length=256)]] = field(default_factory=dict)
    # A cheap GET that answers 200 while it serves: a provider has no /health (the edge's regions do).
    probe_path: Annotated[str, Meta(pattern=r"^/[^\s]*$")] = "/v1/models"
    # False: it sends no usage figures (or none to trust): the edge bills its own count (the prompt as its
    # tokenizer counts it, the tokens it relayed), tells the client that figure, and does not ask for one.
    reports_usage: bool = True
    # True: it honours vLLM's continue_final_message (extends an open assistant turn), so a stream another
    # region cut mid-answer may be continued there. Off by default: a server that ignores it would answer
    # the half-answer as a new turn. (A stream cut before its first token is asked afresh anywhere.)
    continues_answers: bool = False
    # How it takes a JSON schema to answer in: OpenAI's response_format {"type": "json_schema", ...}, or
    # "json_object": the schema beside that type ({"type": "json_object", "schema": ...}), which is how
    # llama-cpp-python's server takes it (it refuses json_schema).
    schema_as: Literal["json_schema", "json_object"] = "json_schema"


class RegionSpec(Struct, forbid_unknown_fields=True, kw_only=True):
    name: Name
    # One replica (``url``) or several (``replicas``: named ``<region>/<n>``).
    url: Url | None = None
    replicas: list[Url] = field(default_factory=list)
    # Where it is: a city from configs/cities.toml, or latitude, longitude and country.
    city: str = ""
    latitude: Latitude | None = None
    longitude: Longitude | None = None
    country: Code | None = None
    continent: Code | None = None
    # Models it serves (empty: every model the edge serves) and the pool they make.
    models: list[str] = field(default_factory=list)
    pool: PoolClass = "large"
    # The most requests this edge keeps in flight at each replica (beyond it, it is overloaded).
    capacity: Annotated[int, Meta(ge=1)] = 64
    # On this side of the ocean (the last mile only): the degraded tier, which answers what the remote
    # regions cannot (a cable cut), or takes its pool's traffic, as the edge's [degraded] policy says.
    local: bool = False
    # Not a Nearshore regional node but an OpenAI-compatible provider (its credentials, its model ids).
    provider: ProviderSpec | None = None

    def urls(self) -> list[str]:
        return list(self.replicas) if self.replicas else ([self.url] if self.url else [])


class Place(Struct, frozen=True):
    latitude: float
    longitude: float
    country: str
    continent: str
    known: bool = True  # False: no location given; the router relies on measured round trips alone


UNKNOWN_PLACE = Place(0.0, 0.0, "", "", known=False)


class ResidencyPolicy(Struct, forbid_unknown_fields=True, kw_only=True):
    """Requests it covers (by the client's country or continent, or by the key's tenant) are served only in
    ``regions``. A request covered by several policies may go only where all of them allow."""

    name: Name
    regions: Annotated[list[Name], Meta(min_length=1)]
    countries: list[Code] = field(default_factory=list)
    continents: list[Code] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)


class HealthSettings(Struct, forbid_unknown_fields=True, kw_only=True):
    # Active probes of /health on each replica (every upstream.health_interval_s, upstream.health_timeout_s).
    # Passes in a row before a down replica is routable, and failures in a row before it is not. These and
    # the ejections below are bounded, so that one setting cannot keep a replica out for hours.
    healthy_threshold: Annotated[int, Meta(ge=1, le=100)] = 2
    unhealthy_threshold: Annotated[int, Meta(ge=1, le=100)] = 2
    # Outlier detection from real traffic (Envoy's): this many failures in a row (connect errors, 5xx,
    # timeouts) eject a replica for base_ejection_s times the number of its ejections so far (at most
    # max_ejection_s); never more than max_ejected_percent of the replicas at once.
    consecutive_failures: Annotated[int, Meta(ge=1, le=1000)] = 3
    base_ejection_s: Annotated[float, Meta(gt=0, le=3600)] = 10.0
    max_ejection_s: Annotated[float, Meta(gt=0, le=3600)] = 300.0
    max_ejected_percent: Annotated[float, Meta(ge=0, le=100)] = 50.0


class RoutingSettings(Struct, forbid_unknown_fields=True, kw_only=True):
    # Until a path is measured: its speed-of-light floor times this (cable detours, routing).
    path_inflation: Annotated[float, Meta(ge=1)] = 1.6
    # Weight of the newest sample in the round-trip and first-token moving averages.
    ewma_alpha: Annotated[float, Meta(gt=0, le=1)] = 0.3
    # A better region must win by this much (ms, or share of the current score, whichever is larger)
    # for hold_s before traffic moves to it: no flapping on noise.
    switch_margin_ms: Annotated[float, Meta(ge=0)] = 10.0
    switch_margin_ratio: Annotated[float, Meta(ge=0)] = 0.15
    hold_s: Annotated[float, Meta(ge=0)] = 3.0
    # What one request costs before measurements: service time, and prefill speed for the prompt term.
    default_service_ms: Annotated[float, Meta(gt=0)] = 2000.0
    # A generated token's time, until a replica's streams measured its own: what a unary answer's time
    # has to explain before the rest counts as queue.
    default_decode_ms_per_token: Annotated[float, Meta(gt=0, le=10_000)] = 25.0
    # The prefill term's speed; and what a sample's first token has to explain for a prompt's first 256
    # tokens (beyond them, the replica's own cost where its load report carries one: ``pft``).
    prefill_tokens_per_s: Annotated[float, Meta(gt=0)] = 2000.0
    # What real requests saw: the first-token time beyond the round trip and the prompt's expected prefill
    # is the queue term (or the reported queue, whichever is larger). A replica that lost its traffic to what
    # it was measured at gets one request every explore_after_s to measure it again (while probes alone
    # would make it about as good as the best); an estimate that old is replaced by the new sample, so a
    # replica wins its traffic back once it has recovered.
    explore_after_s: Annotated[float, Meta(gt=0)] = 10.0
    # Every node takes some time of its own to a first token (its queue, its first step): observations count
    # beyond the least any replica serving the model was observed at, and at most this is taken as that
    # (a replica not measured yet is expected to be as good as the best measured, or this good).
    baseline_first_token_ms: Annotated[float, Meta(ge=0)] = 500.0
    # Prefix affinity: prompts sharing at least this many leading characters go to the replica that holds
    # them, while the replicas' loads are balanced (SGLang's rule: not when max - min > balance_abs and
    # max > balance_rel * min, in in-flight requests).
    affinity_min_chars: Annotated[int, Meta(ge=64)] = 1024
    affinity_block_chars: Annotated[int, Meta(ge=16)] = 256
    affinity_entries: Annotated[int, Meta(ge=1)] = 65536
    balance_abs: Annotated[int, Meta(ge=0)] = 8
    balance_rel: Annotated[float, Meta(ge=1)] = 1.5


class GeoConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # false: no route stage; every request tries the routable replicas in the catalog's order.
    route: bool = True
    # Where this edge is: clients with private, loopback or unknown addresses are placed here.
    city: str = "lagos"
    latitude: Latitude | None = None
    longitude: Longitude | None = None
    country: Code | None = None
    continent: Code | None = None
    # A MaxMind-format database (GeoLite2/GeoIP2/DB-IP City or Country); empty: the embedded GeoLite2 City.
    database: str = ""
    # On a missing or corrupt database file: refuse to start (false) or use the embedded one (true).
    fallback_to_embedded: bool = False
    # Peers whose X-Forwarded-For is believed (CIDRs): load balancers, CDNs in front of the edge.
    trusted_proxies: list[str] = field(default_factory=list)
    # Send x-nearshore-route (the choice and its terms) on every response; keys created with --debug
    # may also ask with `x-nearshore-debug: route`.
    explain: bool = False
    residency: list[ResidencyPolicy] = field(default_factory=list)
    health: HealthSettings = field(default_factory=HealthSettings)
    routing: RoutingSettings = field(default_factory=RoutingSettings)


def place_of(
    key: str,
    city: str,
    latitude: float | None,
    longitude: float | None,
    country: str | None,
    continent: str | None,
) -> Place:
    """Coordinates given win over the city's; a city fills in what is not given."""
    known = cities()
    if not city and latitude is None and longitude is None:
        return UNKNOWN_PLACE
    if city and city not in known:
        raise ValueError(
            f"{key}: unknown city {city!r} (known: {', '.join(sorted(known))}); "
            "or give latitude and longitude"
        )
    base = known.get(city) if city else None
    lat = latitude if latitude is not None else (base.lat if base else None)
    lon = longitude if longitude is not None else (base.lon if base else None)
    if lat is None or lon is None:
        raise ValueError(f"{key}: give a city or both latitude and longitude")
    return Place(
        lat,
        lon,
        country or (base.country if base else ""),
        continent or (base.continent if base else ""),
    )


def region_place(index: int, spec: RegionSpec) -> Place:
    """Where the catalog puts the region; a region named after a known city (``london``) is there."""
    if not spec.city and spec.latitude is None and spec.name in cities():
        spec = replace(spec, city=spec.name)
    return place_of(
        f"regions[{index}] ({spec.name})",
        spec.city,
        spec.latitude,
        spec.longitude,
        spec.country,
        spec.continent,
    )


def edge_place(config: GeoConfig) -> Place:
    return place_of("geo", config.city, config.latitude, config.longitude, config.country, config.continent)


def check_catalog(regions: list[RegionSpec], config: GeoConfig, models: list[str]) -> list[str]:
    """What is wrong with the catalog and the policies, each naming its key; empty when nothing is."""
    problems: list[str] = []
    seen: set[str] = set()
    for i, spec in enumerate(regions):
        key = f"regions[{i}] ({spec.name})"
        if spec.name in seen:
            problems.append(f"{key}: the name {spec.name!r} is used twice")
        seen.add(spec.name)
        if spec.url and spec.replicas:
            problems.append(f"{key}: give url or replicas, not both")
        elif not spec.urls():
            problems.append(f"{key}: no replica (give url or replicas)")
        if len(set(spec.urls())) != len(spec.urls()):
            problems.append(f"{key}: a replica URL is listed twice")
        unknown = sorted(set(spec.models) - set(models))
        if unknown:
            problems.append(
                f"{key}.models: {', '.join(unknown)} not in the edge's models ({', '.join(models)})"
            )
        provider = spec.provider
        if provider is not None and provider.api_key_env and provider.api_key_file:
            problems.append(f"{key}.provider: give api_key_env or api_key_file, not both")
        if provider is not None and (unknown := sorted(set(provider.models) - set(models))):
            problems.append(f"{key}.provider.models: {', '.join(unknown)} not in the edge's models")
        try:
            region_place(i, spec)
        except ValueError as exc:
            problems.append(str(exc))
    try:
        edge_place(config)
    except ValueError as exc:
        problems.append(str(exc))
    names: set[str] = set()
    for i, policy in enumerate(config.residency):
        key = f"geo.residency[{i}] ({policy.name})"
        if policy.name in names:
            problems.append(f"{key}: the name {policy.name!r} is used twice")
        names.add(policy.name)
        unknown = sorted(set(policy.regions) - seen)
        if unknown:
            problems.append(
                f"{key}.regions: unknown region {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(sorted(seen))})"
            )
        if not (policy.countries or policy.continents or policy.tenants):
            problems.append(f"{key}: covers nobody (give countries, continents or tenants)")
    return problems
