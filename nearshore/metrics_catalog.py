"""What a metrics catalog is: one entry per metric family a process exposes on ``/metrics``.

Each process keeps its own list beside its metrics (``edge/metrics_catalog.py``,
``regional/metrics_catalog.py``); tests check a live ``/metrics`` against it (nothing missing, nothing
unlisted) and every dashboard query against it, so the list, the exposition and the dashboards agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MetricType = Literal["counter", "gauge", "histogram"]
# The series a family of each type exposes, by suffix (Prometheus' text format, prometheus_client's
# ``_created`` included).
SERIES_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # the family's name (a counter's series add ``_total``)
    type: MetricType
    labels: tuple[str, ...]
    meaning: str  # the HELP text, word for word
    optional_labels: tuple[str, ...] = ()  # labels that a setting adds (e.g. tenant, when asked for)
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds (empty: prometheus_client's defaults)

    def series(self) -> tuple[str, ...]:
        """The series names a scrape shows for this family."""
        return tuple(self.name + suffix for suffix in SERIES_SUFFIXES[self.type])


def by_name(catalog: Iterable[MetricSpec]) -> dict[str, MetricSpec]:
    return {spec.name: spec for spec in catalog}


def family_of(series: str, catalog: Iterable[MetricSpec]) -> MetricSpec | None:
    """The family a series name (``x_bucket``, ``x_total``, ``x``) belongs to, if any."""
    for spec in catalog:
        if series in spec.series():
            return spec
    return None


Family = Counter | Gauge | Histogram


def make_family(spec: MetricSpec, registry: CollectorRegistry, with_optional: bool = False) -> Family:
    """The family ``spec`` declares, in ``registry`` (with its optional labels when a setting asks)."""
    labels = [*spec.labels, *(spec.optional_labels if with_optional else ())]
    if spec.type == "histogram":
        if spec.buckets:
            return Histogram(spec.name, spec.meaning, labels, registry=registry, buckets=spec.buckets)
        return Histogram(spec.name, spec.meaning, labels, registry=registry)
    made = Counter if spec.type == "counter" else Gauge
    return made(spec.name, spec.meaning, labels, registry=registry)
