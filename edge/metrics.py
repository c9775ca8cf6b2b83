"""Prometheus metrics of an edge proxy (``nearshore_edge:*``), made from their catalog
(:mod:`edge.metrics_catalog`).

Every label value is bounded: drawn from the edge's config or code, or mapped to a fixed set by
:mod:`edge.metric_labels` when it comes from outside (a region's error code, a client's model name).
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from edge.metrics_catalog import EDGE_FAMILIES
from nearshore.metrics_catalog import make_family
from nearshore.protocol.schemas import Usage


class EdgeMetrics:
    """The edge's metric families, one attribute each, made from their one declaration: the catalog
    (:data:`edge.metrics_catalog.EDGE_FAMILIES`, attribute name -> name, type, labels, HELP)."""

    def __init__(self, tenant_labels: bool = False) -> None:
        r = self.registry = CollectorRegistry()
        # Tenant names are customer data: a label only when the operator asks for it.
        self.tenant_labels = tenant_labels
        self._children: dict[tuple[str, str, str, str], tuple] = {}
        for attribute, spec in EDGE_FAMILIES.items():
            setattr(self, attribute, make_family(spec, r, with_optional=tenant_labels))

    def __getattr__(self, name: str) -> Any:  # (only for a name the catalog does not declare)
        raise AttributeError(f"the edge has no metric family {name!r}: declare it in edge/metrics_catalog.py")

    def count_request(
        self, status: str, region: str, model: str, tenant: str, usage: Usage, cost_usd: float
    ) -> None:
        """One billed request in every series it moves; label lookups cached (they cost more than the inc)."""
        key = (status, region, model, tenant if self.tenant_labels else "")
        children = self._children.get(key)
        if children is None:
            cost_labels = (model, tenant) if self.tenant_labels else (model,)
            children = self._children[key] = (
                self.requests.labels(status, region),
                self.prompt_tokens.labels(model),
                self.cached_tokens.labels(model),
                self.generation_tokens.labels(model),
                self.cost.labels(*cost_labels),
            )
        requests, prompt, cached, generation, cost = children
        requests.inc()
        prompt.inc(usage.prompt_tokens)
        cached.inc(usage.prompt_tokens_details.cached_tokens)
        generation.inc(usage.completion_tokens)
        cost.inc(cost_usd)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def render_off_loop(self) -> bytes:
        """:meth:`render` on a worker thread. Its time grows with the series: with tenant labels on, 1,000
        tenants' took 29 ms and 10,000 tenants' 0.3 s, which each scrape held every stream still for on the
        event loop. On a thread the loop keeps its turns (the interpreter switches every 5 ms)."""
        return await asyncio.to_thread(self.render)
