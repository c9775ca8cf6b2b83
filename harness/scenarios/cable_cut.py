"""``cable-cut``: every ocean link from Lagos goes down under load, stays down, then comes back. Who answers
the users in Lagos meanwhile, how soon does the edge see the cut, and how soon is traffic back across the
ocean once the cables are repaired?

Clients in Lagos send an open loop of requests through the edge (``MixedLoad``), in a fixed rotation:

    chat     a streamed chat for the instruction-tuned small model (SmolLM2), never cached: London's small
             node answers it at rest, the Lagos-local region stands by
    repeat   one of a few questions for the large model (Gemma) that users ask again and again: the edge's
             response cache answers them once stored
    large    a new question for the large model, never cached: only the remote regions serve it

Phases (``--phases``; the default is ``baseline,cut,restore``):

    baseline   the links as their profiles say
    2009       the pattern of the 2009 SAT-3 cut before the cables go: every ocean link's round trip x2.5
               and 15% of its chunks lost each way (SLAC PingER saw Nigeria's RTT go from ~350 to 850+ ms
               with loss above 15%)
    cut        every ocean link down at once (the links' ``down`` fault: new connections refused, open
               ones reset); the last mile and the Lagos metro link stay up
    restore    the links back, as their profiles say

Per phase: requests, who answered them (a remote region, the cache, the local model), refused with a 503
(a model only the remote regions serve, asked for something the cache does not hold), failed before the
first byte otherwise, cut mid-stream, TTFT p50/p95. Across the cut: seconds until the edge's health shows
every remote region down, until the first answer from Lagos, and after the repair until the small model's
traffic is back on London; streams under way at the cut that the local model continued (the edge's ledger
says which region finished each); and whether the ledger holds a row for every request sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import aiohttp

from harness.launcher import RunningTopology
from harness.models import LARGE, SMALL
from harness.scenarios.base import ScenarioContext, ScenarioResult, check_phases
from harness.scenarios.charts import traffic_chart
from harness.scenarios.traffic import (
    CUT_MID_STREAM,
    FAILED_BEFORE_FIRST_BYTE,
    Attempt,
    HealthWatch,
    ms,
    one_request,
    percentile_ms,
    seconds,
    until,
)
from harness.topology import RegionSpec, Topology, local_regions, nearest_region
from nearshore import tls
from nearshore.protocol.headers import CLIENT_REQUEST_ID, DEBUG
from netem.profiles import load_profile

RATE_PER_S = 2.0
MAX_TOKENS = 16
LONG_STREAM_TOKENS = 160  # the chat the cut catches mid-answer (seconds of streaming on a busy machine)
# ... asking what takes many tokens to answer (the instruct model ends a short answer early, at its EOS).
LONG_QUESTION = "Tell me a long story, in many sentences, about a market day in Lagos."
STREAMING_BEFORE_CUT_S = 0.2  # after its head: its first tokens are on their way to the user
PHASE_S = 8.0  # each phase, once traffic is where it belongs (``--phase-s``)
MAX_WAIT_S = 45.0  # for the edge to see the cut, or to send traffic back after the repair
WARMUP_PROBES = 3
PATTERN_RTT_FACTOR = 2.5
PATTERN_LOSS = 0.15
DEFAULT_PHASES = ("baseline", "cut", "restore")
PHASE_NAMES = ("baseline", "2009", "cut", "restore")
CHAT_QUESTIONS = (
    "What is the capital of Nigeria?",
    "Give me one tip for a rainy day in Lagos.",
    "How do I say thank you in Yoruba?",
    "Name a dish people cook with plantain.",
)
REPEATED_QUESTIONS = ("Lagos is a city on", "The Niger river flows through")
CACHE_HIT = ("HIT", "SEMANTIC")


@dataclass(frozen=True)
class Kind:
    name: str
    model: str
    cached: bool  # may the edge's cache answer it (and store its answer)?


ROTATION = (
    Kind("chat", SMALL, cached=False),
    Kind("repeat", LARGE, cached=True),
    Kind("chat", SMALL, cached=False),
    Kind("large", LARGE, cached=False),
)


@dataclass
class Sent:
    kind: Kind
    client_id: str
    attempt: Attempt


@dataclass
class MixedLoad:
    """An open loop through the edge, one request of the rotation every ``1 / rate_per_s`` seconds."""

    running: RunningTopology
    rate_per_s: float = RATE_PER_S
    max_tokens: int = MAX_TOKENS
    sent: list[Sent] = field(default_factory=list)
    _counter: itertools.count = field(default_factory=itertools.count)

    def question(self, kind: Kind) -> str:
        n = next(self._counter)
        if kind.name == "repeat":
            return REPEATED_QUESTIONS[n % len(REPEATED_QUESTIONS)]
        if kind.name == "chat":
            return CHAT_QUESTIONS[n % len(CHAT_QUESTIONS)]
        return f"Tell me something about the number {n}."

    def body(self, kind: Kind, max_tokens: int = 0, question: str = "") -> bytes:
        question = question or self.question(kind)
        payload = {
            "model": kind.model,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        return json.dumps(payload).encode()

    def headers(self, kind: Kind, client_id: str) -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self.running.api_key}",
            "Content-Type": "application/json",
            DEBUG: "route",
            CLIENT_REQUEST_ID: client_id,
        }
        if not kind.cached:
            headers["Cache-Control"] = "no-cache, no-store"
        return headers

    def new(self, kind: Kind) -> Sent:
        sent = Sent(kind, uuid.uuid4().hex, Attempt(time.perf_counter()))
        self.sent.append(sent)
        return sent

    async def send(
        self, session: aiohttp.ClientSession, kind: Kind, max_tokens: int = 0, sent: Sent | None = None
    ) -> Sent:
        sent = sent or self.new(kind)
        sent.attempt.started = time.perf_counter()
        question = LONG_QUESTION if max_tokens == LONG_STREAM_TOKENS else ""
        body, headers = self.body(kind, max_tokens, question), self.headers(kind, sent.client_id)
        await one_request(session, self.running.edge_url, body, headers, sent.attempt)
        return sent

    async def catch_a_stream(self, cut: Callable[[], Awaitable[None]]) -> Sent:
        """Start a long chat, ``cut`` once its first token is in, and wait for its end: a stream under way
        when the cables go, which must finish on the local model."""
        async with self.session() as session:
            sent = self.new(ROTATION[0])
            task = asyncio.create_task(self.send(session, sent.kind, LONG_STREAM_TOKENS, sent))
            # The answer's head names its region as soon as it arrives; a few tokens follow it.
            await until(lambda: bool(sent.attempt.region) or task.done(), MAX_WAIT_S)
            await asyncio.sleep(STREAMING_BEFORE_CUT_S)
            await cut()
            return await task

    def session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=tls.client_context(ca=Path(self.running.edge_ca)), limit=0)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))

    async def run(self, stop: asyncio.Event) -> None:
        async with self.session() as session:
            tasks = []
            start = time.perf_counter()
            for n in itertools.count():
                if stop.is_set():
                    break
                tasks.append(asyncio.create_task(self.send(session, ROTATION[n % len(ROTATION)])))
                with contextlib.suppress(TimeoutError):
                    due = start + (n + 1) / self.rate_per_s  # from the start: late wake-ups do not add up
                    await asyncio.wait_for(stop.wait(), due - time.perf_counter())
            await asyncio.gather(*tasks)

    async def prime_cache(self, timeout_s: float = 60.0) -> None:
        """Ask each repeated question until the cache answers it (it stores answers off the request's path,
        and its first store loads the embedder): the cut phase then measures hits, not a cold cache."""
        kind = next(k for k in ROTATION if k.name == "repeat")
        deadline = time.perf_counter() + timeout_s
        async with self.session() as session:
            for question in REPEATED_QUESTIONS:
                while True:
                    payload = json.loads(self.body(kind))
                    payload["messages"][0]["content"] = question
                    attempt = Attempt(time.perf_counter())
                    headers = self.headers(kind, uuid.uuid4().hex)
                    body = json.dumps(payload).encode()
                    await one_request(session, self.running.edge_url, body, headers, attempt)
                    if attempt.cache in CACHE_HIT:
                        break
                    if time.perf_counter() > deadline:
                        raise RuntimeError(f"the edge did not cache {question!r} within {timeout_s:g}s")
                    await asyncio.sleep(0.5)

    def of(self, kind: str) -> list[Sent]:
        return [s for s in self.sent if s.kind.name == kind]


def answered_by(sent: Sent, local: set[str]) -> str:
    """Who answered: "cache", "local", "remote", or "refused" (a 503) / "failed" when nobody did."""
    a = sent.attempt
    if not a.served:
        return "refused" if a.status == 503 else "failed"
    if a.cache in CACHE_HIT:
        return "cache"
    return "local" if a.region in local else "remote"


def ledger_rows(run_dir: str, client_ids: list[str], wait_s: float = 10.0) -> dict[str, dict[str, str]]:
    """The edge's ledger rows of these requests, by client request id (the edge writes them off the request's
    path: waits until every one is there, at most ``wait_s``)."""
    path = Path(run_dir) / "ledger.sqlite3"
    deadline = time.monotonic() + wait_s
    rows: dict[str, dict[str, str]] = {}
    while True:
        if path.exists():
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                db.row_factory = sqlite3.Row
                found = db.execute(
                    "SELECT client_request_id, region, continued_from, degraded, cache_status, status "
                    "FROM usage WHERE client_request_id != ''"
                ).fetchall()
            rows = {r["client_request_id"]: dict(r) for r in found}
        if all(c in rows for c in client_ids) or time.monotonic() > deadline:
            return rows
        time.sleep(0.25)


class CableCut:
    name: ClassVar[str] = "cable-cut"
    description: ClassVar[str] = (
        "every ocean link down under load, then back: the cache and the Lagos-local model answer meanwhile"
    )
    health_interval_s: ClassVar[float] = 0.5
    phase_names: ClassVar[tuple[str, ...]] = PHASE_NAMES

    def run(self, ctx: ScenarioContext) -> ScenarioResult:
        return asyncio.run(self._run(ctx))

    async def _run(self, ctx: ScenarioContext) -> ScenarioResult:
        t = ctx.topology
        local = {r.name for r in local_regions(t)}
        if not local:
            raise RuntimeError(f"topology {t.name} has no local region: nothing would answer in a cut")
        ocean = [r for r in t.regions if not r.local]
        home = nearest_region(t, SMALL).name  # where the chat traffic belongs at rest
        phase_s = ctx.phase_s or PHASE_S
        check_phases(self, ctx.phases)
        phases = [p for p in PHASE_NAMES if p in ctx.phases] if ctx.phases else list(DEFAULT_PHASES)
        load = MixedLoad(ctx.running)
        watch = HealthWatch(ctx.running.metrics_url)
        stop, watching = asyncio.Event(), asyncio.Event()
        windows: list[tuple[str, float, float]] = []
        marks: dict[str, float] = {}
        control = ctx.running.control_url

        def chats_on(good: set[str] | None, since: float) -> bool:
            served = [s.attempt for s in load.of("chat") if s.attempt.started >= since and s.attempt.region]
            return len(served) >= 3 and all(
                (a.region in good) if good else (a.region == home) for a in served[-3:]
            )

        async with aiohttp.ClientSession() as links:

            async def change(region: RegionSpec, body: dict | None = None, fault: str = "") -> None:
                for name in (f"edge-{region.name}", f"direct-{region.name}-ocean"):
                    url = f"{control}/links/{name}" + (f"/faults/{fault}" if fault else "")
                    request = links.post(url) if fault else links.put(url, json=body)
                    async with request as response:
                        response.raise_for_status()

            async def drive() -> None:
                try:
                    await load.prime_cache()
                    begun = time.perf_counter()
                    await asyncio.sleep(WARMUP_PROBES * self.health_interval_s)
                    await until(lambda: chats_on(None, begun), MAX_WAIT_S)
                    for phase in phases:
                        started = time.perf_counter()
                        if phase == "2009":
                            for region in ocean:
                                profile = load_profile(region.link)
                                for way in ("a_to_b", "b_to_a"):
                                    delay = profile.way(way).delay_ms * PATTERN_RTT_FACTOR
                                    await change(region, {"direction": way, "delay_ms": delay})
                                loss = {"model": "bernoulli", "p": PATTERN_LOSS}
                                await change(region, {"loss": loss})
                        elif phase == "cut":

                            async def cut() -> None:
                                for region in ocean:
                                    await change(region, fault="down")
                                marks["cut"] = time.perf_counter()

                            await load.catch_a_stream(cut)
                            started = marks["cut"]
                            await until(lambda: chats_on(local, marks["cut"]), MAX_WAIT_S)
                        elif phase == "restore":
                            for region in ocean:
                                await change(region, fault="up")
                                await change(region, {"profile": region.link})
                            marks["restore"] = started = time.perf_counter()
                            await until(lambda: chats_on(None, marks["restore"]), MAX_WAIT_S)
                        await asyncio.sleep(phase_s)
                        windows.append((phase, started, time.perf_counter()))
                finally:
                    stop.set()
                    watching.set()

            await asyncio.gather(drive(), load.run(stop), watch.run(watching))
        rows = await asyncio.to_thread(ledger_rows, ctx.running.run_dir, [s.client_id for s in load.sent])
        return self._result(ctx, t, load, watch, windows, marks, rows, local, home, ocean)

    def _result(
        self,
        ctx: ScenarioContext,
        t: Topology,
        load: MixedLoad,
        watch: HealthWatch,
        windows: list[tuple[str, float, float]],
        marks: dict[str, float],
        ledger: dict[str, dict[str, str]],
        local: set[str],
        home: str,
        ocean: list[RegionSpec],
    ) -> ScenarioResult:
        measured = [s for s in load.sent if s.attempt.started >= windows[0][1]]
        table, phases_data = [], []
        for name, start, end in windows:
            group = [s for s in measured if start <= s.attempt.started < end]
            by: dict[str, int] = {}
            for s in group:
                who = answered_by(s, local)
                by[who] = by.get(who, 0) + 1
            ttfts = [s.attempt.ttft_s for s in group if s.attempt.served]
            kinds = {
                k: {
                    w: sum(1 for s in group if s.kind.name == k and answered_by(s, local) == w)
                    for w in ("remote", "cache", "local", "refused", "failed")
                }
                for k in dict.fromkeys(r.name for r in ROTATION)
            }
            figures = {
                "phase": name,
                "seconds": end - start,
                "requests": len(group),
                "answered_by": by,
                "by_kind": kinds,
                "refused_503": by.get("refused", 0),
                "failed_before_first_byte": sum(
                    s.attempt.outcome == FAILED_BEFORE_FIRST_BYTE and s.attempt.status != 503 for s in group
                ),
                "cut_mid_stream": sum(s.attempt.outcome == CUT_MID_STREAM for s in group),
                "ttft_p50_ms": percentile_ms(ttfts, 50),
                "ttft_p95_ms": percentile_ms(ttfts, 95),
            }
            phases_data.append(figures)
            table.append(
                [
                    name,
                    str(len(group)),
                    str(by.get("remote", 0)),
                    str(by.get("cache", 0)),
                    str(by.get("local", 0)),
                    str(figures["refused_503"]),
                    str(figures["failed_before_first_byte"]),
                    str(figures["cut_mid_stream"]),
                    ms(figures["ttft_p50_ms"]),
                    ms(figures["ttft_p95_ms"]),
                ]
            )
        data = self._timings(load, watch, marks, ledger, local, home, ocean)
        data |= {"phases": phases_data, "home": home, "local": sorted(local)}
        t0 = windows[0][1]
        data["attempts"] = [
            {**s.attempt.row(t0), "kind": s.kind.name, "by": answered_by(s, local)} for s in measured
        ]
        for s in load.sent:  # the chart draws the cache as a place that answered
            if s.attempt.cache in CACHE_HIT:
                s.attempt.region = "cache"
        chart = traffic_chart(
            ctx.out_dir / f"{self.name}.png",
            [s.attempt for s in measured],
            windows[0][1],
            windows,
            "cable-cut: every ocean link from Lagos down, then back (who answered, and how fast)",
            events=[(label, at) for label, at in marks.items()],
        )
        notes = [
            f"{RATE_PER_S:g} requests/s from Lagos through the edge, in turn: chat ({SMALL}, never cached), "
            f"repeat ({LARGE}, {len(REPEATED_QUESTIONS)} questions asked again and again), large ({LARGE}, a "
            f"new question each time); {MAX_TOKENS} tokens each, streamed.",
            f"Cut: the edge saw every remote region down after {seconds(data['detect_s'])} s; first answer "
            f"from Lagos {seconds(data['first_local_s'])} s after the cut; streams under way at the cut "
            f"continued on the local model: {data['continued_on_local']} of {data['in_flight_at_cut']}.",
            f"Restore: chat back on {home} {seconds(data['back_s'])} s after the links came back.",
            f"Ledger: {data['ledger_rows']} rows for {data['sent']} requests sent.",
        ]
        return ScenarioResult(
            title=f"cable-cut on {t.name}: {', '.join(r.name for r in ocean)} across the ocean, "
            f"{', '.join(sorted(local))} local",
            columns=[
                "phase",
                "requests",
                "remote",
                "cache",
                "local",
                "503",
                "failed before 1st byte",
                "cut mid-stream",
                "TTFT p50 ms",
                "p95 ms",
            ],
            rows=table,
            notes=notes,
            chart=str(chart),
            data=data,
        )

    @staticmethod
    def _timings(
        load: MixedLoad,
        watch: HealthWatch,
        marks: dict[str, float],
        ledger: dict[str, dict[str, str]],
        local: set[str],
        home: str,
        ocean: list[RegionSpec],
    ) -> dict[str, object]:
        data: dict[str, object] = {
            "detect_s": None,
            "first_local_s": None,
            "back_s": None,
            "in_flight_at_cut": 0,
            "continued_on_local": 0,
        }
        cut, restore = marks.get("cut"), marks.get("restore")
        if cut is not None:
            downs = [watch.first(cut, r.name, lambda status: not status.startswith("up")) for r in ocean]
            seen = [d for d in downs if d is not None]
            if seen and len(seen) == len(downs):
                data["detect_s"] = max(seen) - cut
            local_answers = [
                s.attempt.started + s.attempt.ttft_s - cut
                for s in load.sent
                if s.attempt.started >= cut and s.attempt.served and s.attempt.region in local
            ]
            data["first_local_s"] = min(local_answers, default=None)
            # Streams the cut caught: sent before it, still under way at it, answered by a remote region.
            caught = [
                s
                for s in load.sent
                if s.attempt.started < cut < s.attempt.ended and answered_by(s, local) == "remote"
            ]
            data["in_flight_at_cut"] = len(caught)
            data["continued_on_local"] = sum(
                1
                for s in caught
                if (row := ledger.get(s.client_id)) and row["continued_from"] and row["region"] in local
            )
        if restore is not None:
            chats = sorted(
                (s.attempt for s in load.of("chat") if s.attempt.started >= restore and s.attempt.served),
                key=lambda a: a.started,
            )
            last_away = max((i for i, a in enumerate(chats) if a.region != home), default=-1)
            if last_away < len(chats) - 1:
                data["back_s"] = max(0.0, chats[last_away + 1].started - restore)
        data["sent"] = len(load.sent)
        data["ledger_rows"] = sum(1 for s in load.sent if s.client_id in ledger)
        return data


__all__ = ["CableCut", "MixedLoad", "answered_by"]
