"""The Grafana dashboard (configs/grafana/nearshore.json) is valid dashboard JSON, and every metric its
panels query is a series of a family the edge or the regions expose (issue 12)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edge.metrics_catalog import EDGE_METRICS
from nearshore.metrics_catalog import family_of
from regional.metrics_catalog import REGION_METRICS

DASHBOARD = Path(__file__).resolve().parents[2] / "configs" / "grafana" / "nearshore.json"
CATALOG = (*EDGE_METRICS, *REGION_METRICS)
GRID_COLUMNS = 24

FUNCTIONS = {
    "abs",
    "avg",
    "avg_over_time",
    "clamp_max",
    "clamp_min",
    "count",
    "delta",
    "deriv",
    "histogram_quantile",
    "increase",
    "irate",
    "label_replace",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "quantile",
    "rate",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "stddev",
    "sum",
    "time",
    "topk",
    "bottomk",
    "vector",
}
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_RANGE = re.compile(r"\[[^\]]*\]")
_MATCHERS = re.compile(r"\{[^}]*\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NUMBER = re.compile(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", re.IGNORECASE)
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> list[str]:
    """The series names a PromQL expression selects (label values, ranges, matchers and grouping lists
    stripped; function names checked against PromQL's)."""
    text = _STRING.sub(" ", expr)
    text = _RANGE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = []
    for match in _IDENTIFIER.finditer(text):
        word, rest = match.group(), text[match.end() :].lstrip()
        if rest.startswith("("):
            assert word in FUNCTIONS, f"unknown function {word!r} in {expr}"
        elif word not in KEYWORDS:
            names.append(word)
    return names


def test_the_parser_finds_metrics_and_suffixes():
    expr = (
        'histogram_quantile(0.99, sum by (le, region) (rate(nearshore:ttft_bucket{region=~"$region"}'
        "[$__rate_interval]))) / ignoring(result) group_left sum(rate(nearshore_edge:x_total[5m])) * 1e6"
    )
    assert metric_names(expr) == ["nearshore:ttft_bucket", "nearshore_edge:x_total"]
    assert family_of("nearshore:time_to_first_token_seconds_bucket", CATALOG) is not None
    assert (
        family_of("nearshore:time_to_first_token_seconds_total", CATALOG) is None
    )  # a histogram has no _total
    assert family_of("nearshore_edge:requests", CATALOG) is None  # a counter's series end in _total
    with pytest.raises(AssertionError):
        metric_names("sumx(nearshore:x)")


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found += panel.get("panels", [])  # a collapsed row holds its panels
    return found


def test_dashboard_is_grafana_json():
    d = load()
    assert d["title"] and d["uid"] and isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    variables = {v["name"]: v for v in d["templating"]["list"]}
    source = variables["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels(d):
        g = panel["gridPos"]
        assert all(isinstance(g[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= GRID_COLUMNS, panel["title"]
        mine = {(g["x"] + i, g["y"] + j) for i in range(g["w"]) for j in range(g["h"])}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"]["uid"] == "${datasource}"


def test_every_queried_metric_is_in_the_catalogs():
    d = load()
    exprs = [t["expr"] for p in panels(d) if p["type"] != "row" for t in p["targets"]]
    for variable in d["templating"]["list"]:
        if variable["type"] == "query":  # Grafana's label_values(metric, label)
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["definition"])
            assert inner, variable["definition"]
            exprs.append(inner.group(1))
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr}"
        for name in names:
            family = family_of(name, CATALOG)
            assert family is not None, f"{name} (in {expr}) is not a series of any catalogued family"
            used.add(family.name)
    # The panels the issue asks for, by the families they read.
    for needed in (
        "nearshore_edge:time_to_first_token_seconds",
        "nearshore:time_to_first_token_seconds",
        "nearshore:inter_token_latency_seconds",
        "nearshore:generation_tokens",
        "nearshore_edge:cache_lookups",
        "nearshore:num_requests_waiting",
        "nearshore_edge:rate_limited",
        "nearshore:request_errors",
        "nearshore_edge:region_rtt_seconds",
        "nearshore_edge:routed",
        "nearshore:kv_cache_usage_perc",
        "nearshore_edge:cost_usd",
    ):
        assert needed in used, f"no panel reads {needed}"


def test_percentiles_read_histogram_buckets():
    for panel in panels(load()):
        for target in panel.get("targets", []):
            expr = target["expr"]
            if "histogram_quantile" in expr:
                assert all(n.endswith("_bucket") for n in metric_names(expr)), expr
                assert "sum by (le" in expr, expr  # buckets summed over instances, keeping le
