"""Data residency: the regions a request may be served in, by its client's country or continent and by its
key's tenant. A request no policy covers may go anywhere; one that several cover, only where all allow."""

from __future__ import annotations

from dataclasses import dataclass

from geo.catalog import ResidencyPolicy


@dataclass(frozen=True, slots=True)
class Allowed:
    regions: frozenset[str] | None  # None: anywhere
    policies: tuple[str, ...]  # the names of the policies that decided it


class Residency:
    def __init__(self, policies: list[ResidencyPolicy]) -> None:
        self.policies = policies

    def allowed(self, country: str, continent: str, tenant: str) -> Allowed:
        regions: frozenset[str] | None = None
        names: list[str] = []
        for p in self.policies:
            if country in p.countries or continent in p.continents or tenant in p.tenants:
                names.append(p.name)
                own = frozenset(p.regions)
                regions = own if regions is None else regions & own
        return Allowed(regions, tuple(names))
