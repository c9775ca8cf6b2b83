"""The relay and continue stages in process, over a fake region response and a fake client socket: what
reaches the client byte for byte, what the journey records, and who holds a replica's in-flight slot."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from edge.asking import take
from edge.config import EdgeConfig
from edge.journey import Admission, Call, Journey, WholeAnswer
from edge.limits import Decision, Window
from edge.metrics import EdgeMetrics
from edge.opened import Opened, UpstreamTiming
from edge.provider import Provider
from edge.retry import Deadline, RetryBudget
from edge.sse_relay import SseRelay, StreamLimits
from edge.stages.continuation import continue_stage
from edge.stages.relay import UnaryReply, relay
from edge.stream_reply import StreamReply
from edge.token_count import EstimatingCounter
from edge.upstream import Upstream
from geo.catalog import ProviderSpec
from nearshore.protocol import sse
from nearshore.protocol.headers import CONTINUE, REGION
from nearshore.protocol.schemas import ChatCompletionRequest

MAX_TOKENS = 16
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode()


def chunk(content: str | None = None, role: str | None = None, finish: str | None = None) -> bytes:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return event(
        {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def usage_chunk(usage: dict) -> bytes:
    return event({"object": "chat.completion.chunk", "choices": [], "usage": usage})


def wire(*events: bytes) -> bytes:
    return b"".join(e + b"\n\n" for e in events)


class RegionResponse:
    """A region's response as the relay reads it: its body pushed to the sink in the reads given, then
    ended cleanly (``"eof"``), left open (``"open"``: its chunked terminator still on the way) or broken."""

    def __init__(
        self,
        reads: list[bytes],
        ending: str | BaseException = "open",
        status: int = 200,
        content_type: str = "text/event-stream",
        body: bytes = b"",
    ) -> None:
        self.reads, self.ending = reads, ending
        self.status, self.content_type, self.headers, self.connect_s = status, content_type, {}, 0.0
        self.body = body  # a unary answer's, read with read()
        self.content_length: int | None = len(body) if body else None
        self.complete = bool(body)
        self.closed = self.pooled = False

    def push_to(self, sink: SseRelay) -> None:
        asyncio.get_running_loop().call_soon(self._play, sink)

    def _play(self, sink: SseRelay) -> None:
        for data in self.reads:
            sink.data(data)
            sink.flush()  # as the connection does at the end of each read
        if self.ending == "eof":
            sink.end()
        elif isinstance(self.ending, BaseException):
            sink.error(self.ending)

    async def read(self) -> bytes:
        body, self.body = self.body, b""
        return body

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def abort(self, exc: BaseException) -> None:
        raise AssertionError(f"the relay's clock ran out: {exc}")

    async def finish(self, seconds: float) -> None:
        self.pooled = True  # read to its end: the connection goes back to its pool
        self.closed = True

    def close(self) -> None:
        self.closed = True


class ClientSocket:
    """The client's transport: every byte the relay writes, in order (raw, as an HTTP/1.0 body)."""

    def __init__(self, gone: bool = False) -> None:
        self.sent = bytearray()
        self.gone = gone
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return self.gone

    def get_write_buffer_size(self) -> int:
        return 0

    def abort(self) -> None:
        self.aborted = True


class ClientResponse:
    """The client's stream response (aiohttp's, as the relay uses it): its writes go to the same socket."""

    def __init__(self, socket: ClientSocket) -> None:
        self.socket, self.headers, self.prepared, self.ended = socket, {}, False, False
        self._payload_writer = None

    async def prepare(self, request: object) -> None:
        self.prepared = True

    async def write(self, data: bytes) -> None:
        if self.socket.gone:
            raise ConnectionResetError("the client went away")
        self.socket.write(data)

    async def write_eof(self, data: bytes = b"") -> None:
        if data:
            await self.write(data)
        self.ended = True


class RegionPool:
    """The H1 pool of one replica: each request gets the next response given."""

    def __init__(self, *responses: RegionResponse) -> None:
        self.responses = list(responses)
        self.asked: list[bytes] = []

    async def request(
        self, method: str, path: str, headers: dict, body: bytes, timeout_s: float
    ) -> RegionResponse:
        self.asked.append(body)
        return self.responses.pop(0)


class Pool:
    """The edge's upstream pool as the stages use it: the order to fail over in, and what they report."""

    def __init__(self, order: list[Upstream]) -> None:
        self.order = order
        self.failed_with: list[tuple[str, str]] = []
        self.replenished: list[Upstream] = []
        self.router = SimpleNamespace(finished=lambda replica, ms: self.finished.append(replica.id))
        self.finished: list[str] = []

    def ordered(self, route: object) -> list[Upstream]:
        return list(self.order)

    def failed(self, upstream: Upstream, why: str, refused: bool = False) -> None:
        self.failed_with.append((upstream.name, why))

    def answered(self, *args: object) -> None: ...

    async def replenish(self, upstream: Upstream) -> None:
        self.replenished.append(upstream)


def replica(name: str, *responses: RegionResponse) -> Upstream:
    who = SimpleNamespace(id=name, region=name, inflight=0, load=None)
    return Upstream(who, RegionPool(*responses), RetryBudget(0.2, 1.0, burst=10.0))


class Harness:
    """One streamed chat request, admitted and forwarded to ``first``, its stream side over ``socket``."""

    def __init__(
        self, socket: ClientSocket, keep_usage: bool = False, continue_header: str = "", stream: bool = True
    ) -> None:
        self.background: list[asyncio.Task] = []
        self.pool = Pool([])
        state = SimpleNamespace(
            config=EdgeConfig(),
            metrics=EdgeMetrics(),
            pool=self.pool,
            counter=EstimatingCounter(),
            in_background=self._in_background,
        )
        request = SimpleNamespace(
            transport=socket, headers={CONTINUE: continue_header} if continue_header else {}
        )
        self.journey = journey = Journey(request, state, "chat", time.perf_counter(), "req-1")
        journey.body = msgspec.convert(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": stream,
                "max_tokens": MAX_TOKENS,
            },
            ChatCompletionRequest,
        )
        window = Window(0, 0, 0.0)
        journey.admission = Admission(Decision(True, window, window), None, 40, 5, MAX_TOKENS)
        journey.call = Call("/v1/chat/completions", b"{}", {}, {}, keep_usage=keep_usage)
        journey.forwarded.deadline = Deadline.after(30.0)
        self.client = ClientResponse(socket)
        limits = StreamLimits(64 * 1024, 1 << 20, MAX_TOKENS, 0)
        self.stream = StreamReply(journey, SseRelay(request, self.client, limits))
        if stream:  # as start_stream leaves it
            journey.forwarded.stream = journey.relayed = self.stream

    def _in_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.background.append(task)
        return task

    def forward_to(self, upstream: Upstream, response: RegionResponse) -> None:
        """What the forward stage leaves: the answer head taken on the journey, holding its slot."""
        opened = Opened(
            upstream, response, UpstreamTiming(time.perf_counter()), upstream.take_slot(), model="m"
        )
        take(self.journey, opened)

    async def run(self) -> object:
        """The relay stage, then the continue stage if the relay handed the stream on."""
        reply = await relay(self.journey)
        if reply is None:
            reply = await continue_stage(self.journey)
        await asyncio.gather(*self.background)
        return reply

    async def exit(self) -> None:
        """The pipeline's exit: each cleanup runs once."""
        cleanups, self.journey.cleanups = self.journey.cleanups, []
        for cleanup in reversed(cleanups):
            await cleanup()


HELLO = [chunk(role="assistant", content=""), chunk("Hel"), chunk("lo"), chunk(finish="stop")]


@pytest.mark.parametrize("keep_usage", [False, True])
async def test_a_whole_stream_reaches_the_client_as_it_came_and_its_usage_chunk_only_if_asked(
    keep_usage: bool,
):
    socket = ClientSocket()
    h = Harness(socket, keep_usage=keep_usage)
    london = replica("london")
    response = RegionResponse([wire(*HELLO[:2]), wire(*HELLO[2:], usage_chunk(USAGE), b"data: [DONE]")])
    h.forward_to(london, response)

    reply = await h.run()

    assert reply is h.stream
    assert bytes(socket.sent) == wire(*HELLO)  # the usage chunk and [DONE] are held back for the bill
    outcome, relayed = h.journey.outcome, h.journey.relayed
    assert relayed is h.stream  # what reached the client is read from the stream's owner, not copied
    assert (outcome.status, outcome.http_status, relayed.produced) == ("ok", 200, True)
    assert json.loads(relayed.usage) == USAGE
    assert relayed.events == 2 and h.stream.cut_short is None
    assert h.journey.relayed.answer == WholeAnswer("Hello", "stop")
    assert response.pooled  # [DONE] came before the body's end: read to it, so the connection is reused
    assert (
        h.journey.state.metrics.registry.get_sample_value("nearshore_edge:time_to_first_token_seconds_count")
        == 1
    )

    await reply.finish(None)
    usage_end = wire(usage_chunk(USAGE)) if keep_usage else b""
    assert bytes(socket.sent) == wire(*HELLO) + usage_end + sse.DONE and h.client.ended


async def test_a_stream_cut_mid_way_is_reported_and_the_continue_stage_finishes_it_on_another_replica():
    socket = ClientSocket()
    h = Harness(socket)
    rest = {"prompt_tokens": 6, "completion_tokens": 1, "total_tokens": 7}  # the relayed token as prompt
    second = RegionResponse(
        [
            wire(chunk(role="assistant", content=""), chunk("lo"), chunk(finish="stop")),
            wire(usage_chunk(rest), b"data: [DONE]"),
        ]
    )
    london, virginia = replica("london"), replica("virginia", second)
    h.pool.order = [london, virginia]
    h.forward_to(london, RegionResponse([wire(*HELLO[:2])], ending=ConnectionResetError()))

    assert await relay(h.journey) is None  # handed on: the relay reports the cut, it does not continue
    cut = h.stream.cut_short
    assert cut is not None and cut.tried == (london,) and cut.opened.upstream is london
    assert cut.outcome.text == ["Hel"] and cut.outcome.failure is not None
    assert cut.outcome.failure.kind.code == "upstream_unavailable"
    assert not h.journey.outcome.recorded and h.journey.relayed.answer is None

    reply = await continue_stage(h.journey)

    assert reply is h.stream
    # One unbroken answer: the second region's role event is not sent again.
    assert bytes(socket.sent) == wire(*HELLO[:2], chunk("lo"), chunk(finish="stop"))
    asked = json.loads(virginia.pool.asked[0])
    assert asked["messages"][-1]["content"] == "Hel" and asked["continue_final_message"]
    assert asked["max_tokens"] == MAX_TOKENS - 1
    j = h.journey
    assert (j.continued.count, j.continued.from_region, j.forwarded.region) == (1, "london", "virginia")
    assert j.outcome.status == "ok" and j.relayed.events == 2
    # The relayed token is moved from the second region's prompt back to the completion.
    usage = json.loads(j.relayed.usage)
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (5, 2, 7)
    assert j.relayed.answer == WholeAnswer("Hello", "stop")
    assert h.pool.failed_with == [
        ("london", "mid-stream: The region failed mid-stream: its stream broke (ConnectionResetError).")
    ]

    # Each replica's slot is held until the journey's exit, then given back once.
    assert (london.replica.inflight, virginia.replica.inflight) == (1, 1)
    await h.exit()
    assert (london.replica.inflight, virginia.replica.inflight) == (0, 0)
    cut.opened.release()  # a second release of the same answer changes nothing
    assert london.replica.inflight == 0
    assert h.pool.finished == ["virginia"]  # only the region that finished it measured its time


@pytest.mark.parametrize("continues", [False, True])
async def test_a_provider_continues_a_cut_chat_only_if_it_says_it_honours_continue_final_message(
    continues: bool,
):
    socket = ClientSocket()
    h = Harness(socket)
    rest = {"prompt_tokens": 6, "completion_tokens": 1, "total_tokens": 7}
    opened = wire(chunk(role="assistant", content=""), chunk("lo"), chunk(finish="stop"))
    second = RegionResponse([opened, wire(usage_chunk(rest), b"data: [DONE]")])
    london, partner = replica("london"), replica("partner", second)
    partner.provider = Provider(ProviderSpec(continues_answers=continues), "http://127.0.0.1:9")
    h.pool.order = [london, partner]
    h.forward_to(london, RegionResponse([wire(*HELLO[:2])], ending=ConnectionResetError()))

    await h.run()

    j = h.journey
    if continues:
        assert (j.outcome.status, j.continued.count, j.forwarded.region) == ("ok", 1, "partner")
        assert json.loads(partner.pool.asked[0])["continue_final_message"] is True
    else:  # it would answer the half-answer as a new turn: the client gets an error after what it has
        assert (j.outcome.status, j.continued.count, partner.pool.asked) == ("error", 0, [])


async def test_a_cut_stream_that_may_not_continue_ends_with_an_error_event_after_what_was_relayed():
    socket = ClientSocket()
    h = Harness(socket, continue_header="off")
    h.forward_to(replica("london"), RegionResponse([wire(*HELLO[:2])], ending=ConnectionResetError()))

    reply = await h.run()

    j = h.journey
    assert (j.outcome.status, j.outcome.http_status, j.outcome.error_code) == (
        "error",
        503,
        "upstream_unavailable",
    )
    assert j.relayed.events == 1 and j.relayed.answer is None and j.continued.count == 0
    await reply.finish(None)
    end = bytes(socket.sent).removeprefix(wire(*HELLO[:2]))
    error = json.loads(end.removesuffix(sse.DONE).removeprefix(b"data: "))
    assert error["error"]["code"] == "upstream_unavailable" and end.endswith(sse.DONE)


@pytest.mark.parametrize("reads", [1, 2])
async def test_an_event_past_its_bound_ends_the_stream_however_the_reads_cut_it(reads: int):
    socket = ClientSocket()
    h = Harness(socket, continue_header="off")
    body = wire(HELLO[0], chunk("x" * 70_000), *HELLO[2:])  # the bound is 64 KiB; half of the event is not
    middle = len(wire(HELLO[0])) + 35_000
    pieces = [body] if reads == 1 else [body[:middle], body[middle:]]
    h.forward_to(replica("london"), RegionResponse(pieces, ending="eof"))

    reply = await h.run()

    assert (h.journey.outcome.http_status, h.journey.outcome.error_code) == (502, "bad_upstream_response")
    await reply.finish(None)
    end = bytes(socket.sent).removeprefix(wire(HELLO[0]))  # what came before the event went on
    error = json.loads(end.removesuffix(sse.DONE).removeprefix(b"data: "))
    assert "larger than 65536 bytes" in error["error"]["message"]


async def test_a_region_that_answers_an_error_event_is_not_continued():
    socket = ClientSocket()
    h = Harness(socket)
    london = replica("london")
    h.pool.order = [london, replica("virginia")]
    refusal = event(
        {"error": {"message": "bad", "type": "invalid_request_error", "code": "context_length_exceeded"}}
    )
    h.forward_to(london, RegionResponse([wire(*HELLO[:2], refusal)], ending="eof"))

    await h.run()

    assert h.journey.outcome.status == "error" and h.journey.continued.count == 0
    assert h.journey.outcome.error_code == "context_length_exceeded"
    assert h.pool.failed_with == []  # nobody was asked to take it over


async def test_a_client_gone_is_cut_off_and_billed_what_it_got():
    socket = ClientSocket(gone=True)
    h = Harness(socket)
    london = replica("london")
    h.forward_to(london, RegionResponse([wire(*HELLO)]))

    reply = await h.run()

    j = h.journey
    assert reply is h.stream and h.stream.client_left
    assert (j.outcome.status, j.outcome.http_status) == ("aborted", 499)
    assert j.relayed.events == 2 and j.relayed.produced
    assert h.pool.replenished == [london]  # a connection to replace the one the cut stream took down
    await h.stream.finish(None)
    assert socket.aborted and bytes(socket.sent) == b""


async def test_a_unary_answer_is_read_checked_and_its_text_counted():
    h = Harness(ClientSocket(), stream=False)
    answer = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hello there"}, "finish_reason": "stop"}
        ],
        "usage": USAGE,
    }
    body = json.dumps(answer).encode()
    london = replica("london")
    h.forward_to(london, RegionResponse([], content_type="application/json", body=body))

    reply = await h.run()

    assert isinstance(reply, UnaryReply) and reply.answer.body == body and reply.headers[REGION] == "london"
    j = h.journey
    assert j.outcome.status == "ok" and json.loads(j.relayed.usage) == USAGE
    assert j.relayed.answer == WholeAnswer("Hello there", "stop")
    assert j.relayed.delivered is not None and j.relayed.delivered.floor == 1
    assert j.relayed.delivered.tokens >= 2
