"""One key asking for more choices (``n``) than a region can take never benches the region for the other
keys: a request no region could ever take is the client's 400 (the region says so, and once the edge has
its limit from the region's load report, the edge itself), and a request whose choices do not fit the
node's room now is refused alone, never counted against the replica's health nor cooling it for others.

A real edge in front of a real llama.cpp node whose limits are small: one sequence decoded at once and two
waiting, so one request takes at most n = 3 and a single stream leaves room for two."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.conftest import MODEL, Node, start_region
from tests.edge.test_region import client
from tests.edge_fixtures import Edge, start_edge

pytestmark = pytest.mark.slow

TINY = {"max_sequences": 1, "max_waiting": 2, "kv_cache_tokens": 2048, "context_window": 512}
MOST_CHOICES = 3
MESSAGES = [{"role": "user", "content": "Name a city in Nigeria."}]


@pytest.fixture(scope="module")
def node_and_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Edge]]:
    node = start_region(tmp_path_factory.mktemp("tiny-region"), engine=TINY, embeddings={"enabled": False})
    try:
        # Three failures in a row would eject the one replica (the default): the old code's fate.
        edge = start_edge(tmp_path_factory.mktemp("choices-edge"), [("london", node.url)])
    except Exception:
        node.process.stop()
        raise
    yield node, edge
    edge.stop()
    node.process.stop()


def ask(c: openai.OpenAI, n: int = 1, max_tokens: int = 1):
    return c.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=max_tokens, n=n, temperature=0
    )


def test_more_choices_than_any_region_takes_is_a_400_and_benches_no_one(node_and_edge):
    _, edge = node_and_edge
    greedy, other = client(edge, edge.new_key()), client(edge, edge.new_key())
    messages = []
    for n in (128, 81, MOST_CHOICES + 1, MOST_CHOICES + 1, MOST_CHOICES + 1):
        with pytest.raises(openai.BadRequestError) as raised:
            ask(greedy, n=n)
        error = raised.value.response.json()["error"]
        assert error["param"] == "n", error
        messages.append(error["message"])
    # The region's load report told the edge its limit: later ones never left the edge.
    assert any("more than any region" in m and f"at most {MOST_CHOICES}" in m for m in messages), messages
    for _ in range(5):
        assert ask(other).choices[0].message.content is not None
    answer = ask(greedy, n=MOST_CHOICES)  # as many as the node takes are served
    assert len(answer.choices) == MOST_CHOICES


def test_choices_that_do_not_fit_now_are_refused_alone(node_and_edge):
    _, edge = node_and_edge
    greedy, other = client(edge, edge.new_key()), client(edge, edge.new_key())
    story = other.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a long story about Lagos."}],
        max_tokens=400,
        temperature=0,
        stream=True,
    )
    chunks = iter(story)
    next(chunks)  # the story's sequence runs: the node has room for two more, not three
    for _ in range(4):  # more than the failures in a row that would eject the replica
        with pytest.raises(openai.InternalServerError) as raised:
            ask(greedy, n=MOST_CHOICES)
        assert raised.value.response.status_code == 503
        error = raised.value.response.json()["error"]
        assert (error["code"], error["param"]) == ("no_room_for_choices", "n"), error
        assert raised.value.response.headers.get("retry-after")
    story.close()  # the client leaves: the edge aborts the story at the node
    for _ in range(3):  # the replica was neither ejected nor cooling: every other request is served
        assert ask(other).choices[0].message.content is not None
    assert len(ask(greedy, n=MOST_CHOICES).choices) == MOST_CHOICES
