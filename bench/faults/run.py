"""``nearshore bench faults``: what a gateway makes of a misbehaving provider, case by case, beside LiteLLM.

Three ``nearshore hostile`` replicas (a, b serve MODEL; c serves FALLBACK) stand behind our edge, and, with
``--litellm``, behind LiteLLM's proxy configured alike (bench/faults/gateways.py). Each case of
bench/faults/cases.py is sent ``--repeats`` times at once (a fault on one replica: one at a time,
until that many met it), streamed and (where it has a unary form) not; each answer is classified rescued,
advisory or failed; the replicas' /_log counts the attempts they received. Between cases the overrides are
cleared and the run waits out the circuit (``Limits.ejection_s``), so that one case's ejections do not
decide the next. The gateways run one after the other, each stopped in a ``finally`` (a gateway per
layout of regions the cases need: cases.LAYOUTS); every request has a client timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from bench import peers
from bench.faults import report as faults_report
from bench.faults.cases import LAYOUTS, TOKENS, Case, Layout, Observation, classify, pick
from bench.faults.gateways import Limits, start_edge, start_litellm
from bench.faults.report import GatewayRun, VariantResult
from bench.peers import Endpoint
from nearshore.protocol.headers import CLIENT_REQUEST_ID

CLIENT_TIMEOUT_S = 60.0
HOSTILE_LIMIT_S = 120.0  # the longest a replica's answer lasts (the silence case waits 90 s)
LOG_SETTLE_S = 0.2  # a gateway's last abandoned attempt reaches its replica's log
MAX_TRIES_PER_MET = 4  # Case.met_on: at most this many answers per one that met the fault


@dataclass(frozen=True)
class FaultsBench:
    """The run's settings (the command's flags)."""

    litellm: str  # LiteLLM's `litellm` executable, in its own venv ("": ours alone)
    cases: str  # comma-separated case names ("" or "all": every one)
    repeats: int  # requests per case and kind, sent at once
    logs: str  # folder for logs and configs ("": a temp folder)


@dataclass(frozen=True)
class Plan:
    """What every gateway is put through: the replicas (name -> URL), the cases, their repeats, the limits."""

    replicas: dict[str, str]
    cases: list[Case]
    repeats: int
    limits: Limits


# --- one request ------------------------------------------------------------------------------------------


async def ask(
    s: aiohttp.ClientSession, gateway: Endpoint, spec: str, stream: bool, model: str
) -> Observation:
    """One chat completion through the gateway, read to its end or to the client's timeout."""
    client_id = uuid.uuid4().hex
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": f"say it {client_id}"}],  # never two alike: no cache hit
        "max_tokens": TOKENS,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if spec:
        body["user"] = f"mode:{spec}"
    headers = {**gateway.headers, CLIENT_REQUEST_ID: client_id}
    started = time.perf_counter()
    status, retry_after, received = None, None, bytearray()
    try:
        async with s.post(gateway.url + "/v1/chat/completions", json=body, headers=headers) as r:
            status, retry_after = r.status, r.headers.get("Retry-After")
            async for piece in r.content.iter_any():
                received += piece
    except (aiohttp.ClientError, TimeoutError) as exc:
        broke = type(exc).__name__ + (f": {str(exc)[:60]}" if str(exc) else "")
        return Observation(stream, status, bytes(received), time.perf_counter() - started, retry_after, broke)
    return Observation(stream, status, bytes(received), time.perf_counter() - started, retry_after)


# --- the replicas' test routes ---------------------------------------------------------------------------


async def _reset(s: aiohttp.ClientSession, replicas: dict[str, str]) -> None:
    """Every override ended and every log emptied."""
    for url in replicas.values():
        async with s.post(url + "/_control", json={"mode": None}) as r:
            r.raise_for_status()
        async with s.delete(url + "/_log") as r:
            r.raise_for_status()


async def _control(s: aiohttp.ClientSession, url: str, spec: str, for_s: float) -> None:
    async with s.post(url + "/_control", json={"mode": spec, "for_s": for_s}) as r:
        if r.status != 200:
            raise RuntimeError(f"/_control refused {spec!r}: {await r.text()}")


async def _attempts(s: aiohttp.ClientSession, replicas: dict[str, str]) -> dict[str, int]:
    counts = {}
    for name, url in replicas.items():
        async with s.get(url + "/_log") as r:
            requests = (await r.json())["requests"]
        counts[name] = sum(1 for q in requests if q["path"].startswith("/v1/"))
    return counts


# --- one case ---------------------------------------------------------------------------------------------


async def run_variant(
    client: aiohttp.ClientSession,
    control: aiohttp.ClientSession,
    gateway: Endpoint,
    plan: Plan,
    case: Case,
    stream: bool,
) -> VariantResult:
    result = VariantResult(case, stream)
    replicas = plan.replicas
    await _reset(control, replicas)
    tag = uuid.uuid4().hex[:8]
    if case.control:
        for name in case.control_on:
            await _control(control, replicas[name], case.control_spec(tag), case.control_s)
    if case.met_on:
        await _until_met(client, control, gateway, plan, result, tag)
    else:
        if case.requests:  # one after another, spaced: a time line (the outage)
            observations = await _time_line(client, gateway, case, stream, tag)
        else:
            asked = [
                ask(client, gateway, case.body_spec(f"{tag}{i}"), stream, case.model)
                for i in range(plan.repeats)
            ]
            observations = list(await asyncio.gather(*asked))
        for obs in observations:
            _record(result, obs, plan)
        await asyncio.sleep(LOG_SETTLE_S)
        result.attempts = await _attempts(control, replicas)
    await _reset(control, replicas)
    return result


async def _time_line(
    client: aiohttp.ClientSession, gateway: Endpoint, case: Case, stream: bool, tag: str
) -> list[Observation]:
    started = time.monotonic()
    observations = []
    for i in range(case.requests):
        await asyncio.sleep(max(0.0, started + i * case.spacing_s - time.monotonic()))
        if case.interleave:  # a healthy request of another model between each two of the case's
            observations.append(await ask(client, gateway, "", stream, case.interleave))
        observations.append(await ask(client, gateway, case.body_spec(f"{tag}{i}"), stream, case.model))
    return observations


def _record(result: VariantResult, obs: Observation, plan: Plan) -> None:
    result.verdicts.append(classify(result.case, obs, plan.limits.deadline_s))
    result.seconds.append(obs.seconds)


async def _until_met(
    client: aiohttp.ClientSession,
    control: aiohttp.ClientSession,
    gateway: Endpoint,
    plan: Plan,
    result: VariantResult,
    tag: str,
) -> None:
    """One answer at a time until ``repeats`` of them met the faulty replica (a bounded number of tries)."""
    case, replicas = result.case, plan.replicas
    result.attempts = dict.fromkeys(replicas, 0)
    for i in range(plan.repeats * MAX_TRIES_PER_MET):
        if len(result.verdicts) >= plan.repeats:
            break
        for url in replicas.values():
            async with control.delete(url + "/_log") as r:
                r.raise_for_status()
        obs = await ask(client, gateway, case.body_spec(f"{tag}{i}"), result.stream, case.model)
        await asyncio.sleep(LOG_SETTLE_S)
        seen = await _attempts(control, replicas)
        if not seen[case.met_on]:  # the faulty replica was out (its circuit open): let it come back
            result.unmet += 1
            await asyncio.sleep(plan.limits.ejection_s + 0.5)
            continue
        _record(result, obs, plan)
        for name, n in seen.items():
            result.attempts[name] += n


async def run_cases(name: str, gateway: Endpoint, plan: Plan) -> list[VariantResult]:
    connector = aiohttp.TCPConnector(limit=0, ssl=gateway.ssl or True)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    results = []
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as client,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as control,
    ):
        for case in plan.cases:
            for stream in (True, False) if case.unary else (True,):
                result = await run_variant(client, control, gateway, plan, case, stream)
                results.append(result)
                print(faults_report.progress(name, result), flush=True)
                await asyncio.sleep(
                    plan.limits.ejection_s + 0.5
                )  # the circuit closes: the next case starts even
    return results


# --- the run ----------------------------------------------------------------------------------------------


def _through(name: str, start: Callable[[Layout], Endpoint], plan: Plan) -> GatewayRun:
    """Run every case through one kind of gateway: one started per layout the cases need, in the cases'
    order, each stopped whatever happens."""
    run = GatewayRun(name)
    for layout_name in dict.fromkeys(case.layout for case in plan.cases):
        cases = [case for case in plan.cases if case.layout == layout_name]
        gateway: Endpoint | None = None
        try:
            gateway = start(LAYOUTS[layout_name])
            run.results += asyncio.run(run_cases(name, gateway, replace(plan, cases=cases)))
        except Exception as exc:  # one gateway's failure is reported beside the other's figures
            run.error = f"{type(exc).__name__}: {exc}"
            print(f"{name}: did not run: {run.error}", flush=True)
            break
        finally:
            if gateway is not None:
                gateway.stop()
    return run


def run(bench: FaultsBench, limits: Limits | None = None) -> list[GatewayRun]:
    """Every case through our edge, then through LiteLLM's proxy when asked; print the tables."""
    limits = limits or Limits()
    cases = pick(bench.cases)
    if bench.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    litellm = peers.find_litellm(bench.litellm) if bench.litellm else None
    if bench.litellm and litellm is None:
        raise ValueError(f"no LiteLLM executable at {bench.litellm} (install it into its own venv)")
    logs = Path(bench.logs or tempfile.mkdtemp(prefix="nearshore-bench-faults-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"provider-fault bench: {len(cases)} cases x {bench.repeats} at once; limits: first token "
        f"{limits.ttft_s:g}s, stall {limits.stall_s:g}s, deadline {limits.deadline_s:g}s, "
        f"{limits.max_attempts} attempts, circuit {limits.failures_to_eject} failures -> "
        f"{limits.ejection_s:g}s; logs in {logs}",
        flush=True,
    )
    runs: list[GatewayRun] = []
    with contextlib.ExitStack() as stack:
        replicas: dict[str, str] = {}
        for name in dict.fromkeys(r for case in cases for r in LAYOUTS[case.layout].replicas):
            replica = peers.start_stand_in(
                logs, "hostile", name, tokens=TOKENS, limit_s=HOSTILE_LIMIT_S, max_connections=4000
            )
            stack.callback(replica.stop)
            replicas[name] = replica.url
        plan = Plan(replicas, cases, bench.repeats, limits)
        runs.append(
            _through("nearshore edge", lambda layout: start_edge(logs, replicas, layout, limits), plan)
        )
        if litellm is not None:
            version = peers.versions(None, litellm).get("litellm", "?")
            gateway = f"LiteLLM {version}"
            runs.append(
                _through(gateway, lambda layout: start_litellm(logs, litellm, replicas, layout, limits), plan)
            )
    print(faults_report.tables(runs), flush=True)
    return runs
