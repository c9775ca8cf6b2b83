"""JSON nested past the limit through a real edge in front of a real region (issue 34, N5): a 400 naming the
field that nests too deep, refused at the edge before anything decodes it (past about 1,000 levels decoding
ran out of Python's recursion limit: a 500 with a traceback per request), and the edge serves on."""

from __future__ import annotations

import json
from collections.abc import Iterator

import aiohttp
import pytest

from nearshore.bodies import MAX_JSON_DEPTH
from tests.conftest import Node
from tests.edge_fixtures import Edge, start_edge
from tests.regional.test_hardening_body import FIELDS, GOOD, log_since, nested_body

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def edge(region: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    e = start_edge(tmp_path_factory.mktemp("nested-edge"), [("london", region.url)])
    yield e
    e.stop()


async def post(edge: Edge, key: str, body: bytes) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context())) as s,
        s.post(edge.url + "/v1/chat/completions", data=body, headers=headers) as r,
    ):
        return r.status, await r.json(content_type=None)


@pytest.mark.parametrize("field", FIELDS)
async def test_json_nested_past_the_limit_is_a_400_at_the_edge_and_the_edge_serves_on(
    edge: Edge, region: Node, field: str
):
    key = edge.new_key()
    edge_log, region_log = edge.process.log_path, region.process.log_path
    offsets = edge_log.stat().st_size, region_log.stat().st_size
    for depth in (MAX_JSON_DEPTH + 1, 5000):  # just past the limit, and past Python's recursion limit
        status, payload = await post(edge, key, nested_body(field, depth))
        assert status == 400, (depth, payload)
        error = payload["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", field), error
        assert f"at most {MAX_JSON_DEPTH}" in error["message"], error
    status, payload = await post(edge, key, json.dumps(GOOD).encode())
    assert status == 200, payload
    assert payload["usage"]["completion_tokens"] == GOOD["max_tokens"]
    assert "Traceback" not in log_since(edge_log, offsets[0])
    assert "Traceback" not in log_since(region_log, offsets[1])
