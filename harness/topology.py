"""Topologies: who sits where, and which emulated link joins them (``configs/topologies/*.toml``).

A topology names a user (and the last-mile link to the edge), an edge, and regions, each with the link
profile from ``configs/netem/`` that the edge's traffic to it crosses. A region is one regional node serving
one embedded model (``harness.models``: a city with two models is two regions, each on its own link); a
region marked ``local`` is on the edge's side of the ocean (the last mile only), the edge's degraded tier.
Every place is a city of ``configs/cities.toml``, and each link joins the places it stands between (a
profile for another city pair would emulate the wrong distance, and the edge routes by the city the topology
gives each region).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta, Struct, field

from harness.models import LARGE, MODELS
from nearshore.config import ConfigError, load_config
from netem import geo_floor
from netem.profiles import load_profile

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
Name = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9-]*$")]


class UserSpec(Struct, forbid_unknown_fields=True, kw_only=True):
    city: str
    link: str  # profile of the last mile, user -> edge


class EdgeSpec(Struct, forbid_unknown_fields=True, kw_only=True):
    city: str


class RegionSpec(Struct, forbid_unknown_fields=True, kw_only=True):
    name: Name
    city: str
    link: str  # profile of edge -> region
    model: str = LARGE  # the embedded model its node serves (harness.models.MODELS)
    # On the edge's side of the ocean: the degraded tier, which answers what the remote regions cannot.
    local: bool = False


class Topology(Struct, forbid_unknown_fields=True, kw_only=True):
    name: Name
    description: str = ""
    user: UserSpec
    edge: EdgeSpec
    regions: Annotated[list[RegionSpec], Meta(min_length=1)] = field(default_factory=list)


def topology_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        return path
    return CONFIGS / "topologies" / f"{name_or_path}.toml"


def load_topology(name_or_path: str = "lagos") -> Topology:
    """Load and check a topology: every link profile must exist and be valid, names unique."""
    path = topology_path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in (CONFIGS / "topologies").glob("*.toml")))
        raise ConfigError(f"{path}: no such topology (known: {known})")
    topology = load_config(path, Topology)
    names = [r.name for r in topology.regions]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise ConfigError(f"{path}: regions[{i}].name: {name!r} is used twice")
    places = [("user.city", topology.user.city), ("edge.city", topology.edge.city)] + [
        (f"regions[{i}].city", r.city) for i, r in enumerate(topology.regions)
    ]
    for i, region in enumerate(topology.regions):
        if region.model not in MODELS:
            known = ", ".join(MODELS)
            raise ConfigError(f"{path}: regions[{i}].model: unknown model {region.model!r} (known: {known})")
        if region.local and region.city != topology.edge.city:
            raise ConfigError(
                f"{path}: regions[{i}].local: a local region is in the edge's city ({topology.edge.city}), "
                f"not {region.city}"
            )
    if all(r.local for r in topology.regions):
        raise ConfigError(f"{path}: regions: every region is local; at least one must be across the ocean")
    for key, city in places:
        if city not in geo_floor.cities():
            known = ", ".join(sorted(geo_floor.cities()))
            raise ConfigError(f"{path}: {key}: unknown city {city!r} (known: {known})")
    # Each link, and the two places it must join (its profile's a and b).
    links = [("user.link", topology.user.link, topology.user.city, topology.edge.city)] + [
        (f"regions[{i}].link", r.link, topology.edge.city, r.city) for i, r in enumerate(topology.regions)
    ]
    for key, name, a, b in links:
        try:
            profile = load_profile(name)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {key}: {exc}") from None
        except FileNotFoundError:
            where = CONFIGS / "netem"
            raise ConfigError(f"{path}: {key}: no link profile named {name!r} in {where}") from None
        if (profile.a, profile.b) != (a, b):
            raise ConfigError(
                f"{path}: {key}: profile {name!r} joins {profile.a} and {profile.b}, "
                f"but this link joins {a} and {b}"
            )
    return topology


def remote_regions(topology: Topology, model: str = LARGE) -> list[RegionSpec]:
    """The regions across the ocean serving ``model``."""
    return [r for r in topology.regions if r.model == model and not r.local]


def local_regions(topology: Topology) -> list[RegionSpec]:
    return [r for r in topology.regions if r.local]


def nearest_region(topology: Topology, model: str = LARGE) -> RegionSpec:
    """The remote region serving ``model`` whose link has the shortest round trip: where the edge's router
    sends the user's requests for it at rest (local regions stand by)."""
    remote = remote_regions(topology, model)
    if not remote:
        raise ConfigError(f"topology {topology.name}: no region across the ocean serves {model}")
    return min(remote, key=lambda r: load_profile(r.link).rtt_ms)


def serves(topology: Topology, model: str) -> bool:
    return any(r.model == model for r in topology.regions)


def describe(topology: Topology) -> str:
    def one(r: RegionSpec) -> str:
        return f"{r.name} ({r.model}, {r.link}{', local' if r.local else ''})"

    regions = ", ".join(one(r) for r in topology.regions)
    return (
        f"user in {topology.user.city} --{topology.user.link}--> edge in {topology.edge.city} --> {regions}"
    )


def to_dict(topology: Topology) -> dict:
    return msgspec.to_builtins(topology)
