"""The attack pass's fuzz through a real edge over the real region (issue 34): bodies with ``n`` up to 128,
grammars that can never end (or never start), JSON nested up to 1,200 levels in every place a grammar comes
from, and the ordinary fuzz, from one key. None is a 5xx, but for ``no_room_for_choices`` (n choices the node
takes, not beside the other key's request now: a typed 503 with Retry-After about that request alone), and
another key's requests sent all the while are all answered. CI runs 60 cases with a fixed seed;
``NEARSHORE_FUZZ_EXAMPLES=1000`` runs the issue's thousand."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from tests.conftest import Node
from tests.edge.test_fuzz_apis import check
from tests.edge_fixtures import Edge, start_edge
from tests.fuzz_strategies import ATTACK_CHAT, Case, Client, cases

pytestmark = pytest.mark.slow

LONG_RUN = int(os.environ.get("NEARSHORE_FUZZ_EXAMPLES", "0"))
ATTACK = settings(
    max_examples=LONG_RUN or 60,
    derandomize=not LONG_RUN,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
GOOD = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, region: Node) -> Iterator[Edge]:
    e = start_edge(
        tmp_path_factory.mktemp("fuzz-region"),
        [("london", region.url)],
        cache={"enabled": False},
        upstream={"ttft_timeout_s": 120.0},  # a node on a busy CPU may be slow, never wrong
    )
    yield e
    e.stop()


class Victim(threading.Thread):
    """Another key's ordinary requests, one after another, until told to stop: every status is kept."""

    def __init__(self, edge: Edge, key: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(edge.url, edge.ssl_context(), timeout_s=180)
        self.headers = {"Authorization": f"Bearer {key}"}
        self.statuses: list[int] = []
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while not self.done.is_set():
                status, _, _ = self.client.post(
                    "/v1/chat/completions", Case(json.dumps(GOOD).encode()), self.headers
                )
                self.statuses.append(status)
        finally:
            self.client.close()


def test_the_attack_fuzz_never_5xx_and_another_key_is_served_throughout(edge: Edge):
    attacker = edge.new_key(rpm=10**6, tpm=10**9)
    victim = Victim(edge, edge.new_key(rpm=10**6, tpm=10**9))
    client = Client(edge.url, edge.ssl_context(), timeout_s=180)
    headers = {"Authorization": f"Bearer {attacker}"}

    @ATTACK
    @given(case=cases(ATTACK_CHAT))
    def run(case: Case) -> None:
        status, body, content_type = client.post("/v1/chat/completions", case, headers)
        if status == 503 and json.loads(body)["error"]["code"] == "no_room_for_choices":
            return  # n choices that fit the node, not beside the victim's request now: retry shortly
        check(status, body, content_type, case)

    victim.start()
    try:
        run()
    finally:
        victim.done.set()
        victim.join(timeout=300)
        client.close()
    assert victim.statuses and set(victim.statuses) == {200}, victim.statuses
