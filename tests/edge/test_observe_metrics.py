"""/metrics of a real edge and a real regional node hold exactly the families of their catalogs (issue 12).

Nothing missing, nothing unlisted, each with its type, HELP text and labels, after a few requests of
every outcome (answered streamed and not, refused by a limit, refused for a bad key).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge.metrics import EdgeMetrics
from edge.metrics_catalog import EDGE_METRICS
from nearshore.metrics_catalog import MetricSpec, by_name
from nearshore.protocol.schemas import Usage
from regional.metrics_catalog import REGION_METRICS
from tests.conftest import MODEL, Node
from tests.edge_fixtures import Edge, start_edge
from tests.loop_turns import loop_turns_during

HISTOGRAM_LABELS = {"le"}


def check_exposition(text: str, catalog: tuple[MetricSpec, ...]) -> None:
    """``text`` (a scrape) has exactly ``catalog``'s families, with their types, HELP and labels."""
    specs = by_name(catalog)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # prometheus_client writes a counter's or histogram's creation time as a gauge family of its own
    # (``x_created``) in this text format: a series of the family it belongs to, not a family.
    for name in [n for n in families if n.endswith("_created")]:
        owner = specs.get(name.removesuffix("_created"))
        if owner is not None and owner.type in ("counter", "histogram"):
            del families[name]
    assert sorted(set(specs) - set(families)) == [], "listed but missing from /metrics"
    assert sorted(set(families) - set(specs)) == [], "on /metrics but not in the catalog"
    for name, family in families.items():
        spec = specs[name]
        assert family.type == spec.type, name
        assert family.documentation == spec.meaning, name
        allowed = {*spec.labels, *spec.optional_labels}
        for sample in family.samples:
            labels = set(sample.labels) - HISTOGRAM_LABELS
            assert set(spec.labels) <= labels <= allowed, (sample.name, sample.labels)


def test_edge_catalog_matches_its_registry_with_and_without_tenant_labels():
    for tenant_labels in (False, True):
        metrics = EdgeMetrics(tenant_labels=tenant_labels)
        check_exposition(metrics.render().decode(), EDGE_METRICS)
    cost = by_name(EDGE_METRICS)["nearshore_edge:cost_usd"]
    assert cost.optional_labels == ("tenant",)


async def test_a_scrape_of_many_tenants_series_leaves_the_event_loop_its_turns():
    """With tenant labels on, the series grow with the tenants (10,000 tenants' took 0.3 s to render): the
    scrape renders them on a thread, and the same text comes back."""
    metrics = EdgeMetrics(tenant_labels=True)
    usage = Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15)
    for tenant in range(3000):
        metrics.count_request("ok", "london", MODEL, f"tenant-{tenant}", usage, 0.001)
    text, turns = await loop_turns_during(metrics.render_off_loop)
    assert turns >= 2  # rendered on the loop, it would have run to its end in one turn
    assert text == metrics.render()


def test_catalog_entries_are_unique_and_named_for_their_process():
    for catalog, prefix in ((EDGE_METRICS, "nearshore_edge:"), (REGION_METRICS, "nearshore:")):
        names = [spec.name for spec in catalog]
        assert len(names) == len(set(names))
        assert all(
            name.startswith(prefix) and spec.meaning for name, spec in zip(names, catalog, strict=True)
        )


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, region: Node) -> Iterator[Edge]:
    e = start_edge(tmp_path_factory.mktemp("edge-metrics"), [("london", region.url)])
    yield e
    e.stop()


def post(edge: Edge, key: str, **body: object) -> int:
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a river in Africa."}],
        "max_tokens": 3,
        "temperature": 0,
        **body,
    }
    request = urllib.request.Request(
        edge.url + "/v1/chat/completions",
        data=json.dumps(payload).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60, context=edge.ssl_context()) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as error:
        error.read()
        return error.code


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        return response.read().decode()


@pytest.mark.slow
def test_live_edge_and_region_expose_exactly_their_catalogs(edge: Edge, region: Node):
    key = edge.new_key(rpm=3)
    assert post(edge, key) == 200
    assert post(edge, key, stream=True, stream_options={"include_usage": True}) == 200
    assert post(edge, key) == 200  # the same question again
    assert post(edge, key) == 429
    assert post(edge, "ns-000000000000-" + "x" * 43) == 401
    edge_text, region_text = scrape(edge.metrics_url), scrape(region.url)
    check_exposition(edge_text, EDGE_METRICS)
    check_exposition(region_text, REGION_METRICS)
    # The requests moved the series the dashboard reads.
    edge_totals, region_totals = totals(edge_text), totals(region_text)
    assert edge_totals["nearshore_edge:rate_limited_total"] == 1, edge_totals
    assert edge_totals["nearshore_edge:routed_total"] >= 2
    assert region_totals["nearshore:generation_tokens_total"] >= 6


def totals(text: str) -> dict[str, float]:
    """Each series name's sum over its labels."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums
