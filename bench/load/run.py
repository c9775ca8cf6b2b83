"""``nearshore bench load``: load any OpenAI-compatible endpoint (or two, side by side) and report its tails.

One run is a list of steps: an open-loop step per rate of ``--rates`` (or ``--rate``), then a closed-loop
step per level of ``--concurrency``; ``--soak 30m`` makes it one long open-loop step while the watched
processes' memory and file descriptors are sampled. With two ``--url``s, each endpoint gets its own
arrival stream at the step's rate (seeded apart, so their bursts do not line up) and the same prompts in
the same order, interleaved in time. The prompt iterators run on across steps, so a later step is not a
replay of an earlier one that the response cache has already answered.

Every run first measures the generator's own ceiling against a zero-latency server (load_selftest.py) and
prints it beside the table; ``--self-test`` measures only that.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import secrets
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec

from bench.load import charts as load_charts
from bench.load import report as load_report
from bench.load import selftest as load_selftest
from bench.load import targets as load_targets
from bench.load.arrivals import ClosedLoop, OpenLoop, parse_rates
from bench.load.prompts import LengthDist, LoadRequest, PromptMix
from bench.load.report import Ceiling, LoadReport
from bench.load.soak import Growth, Sampler, parse_duration_s, parse_pid, pids_from_run
from bench.load.step_stats import Prices, Sample, Slo, StepSummary, summarize
from bench.load.targets import Target, TargetFlags
from harness.client import Stream, stream_once

CEILING_CONCURRENCY = 32
KNEE_SHARE = 0.9  # the knee: the highest rate at which this share of requests met the objectives


@dataclass
class LoadBench:
    """``bench load``'s flags (cli/bench.py)."""

    url: list[str] = field(default_factory=list)
    api_key: list[str] = field(default_factory=list)
    model: str = "gemma-3-270m"
    insecure: bool = False
    ca: list[str] = field(default_factory=list)
    client_cert: str = ""
    client_key: str = ""
    up: list[str] = field(default_factory=list)
    up_state: str = ""
    rate: float = 0.0
    rates: str = ""
    burstiness: float = 1.0
    concurrency: str = ""
    seconds: float = 10.0
    seed: int | None = None  # None: drawn at start (a rerun's questions would be the cache's answers)
    system_prompts: int = 4
    system_tokens: int = 64
    repeat_share: float = 0.1
    paraphrase_share: float = 0.1
    input_tokens: str = "uniform:32-128"
    output_tokens: str = "fixed:32"
    temperature: float = 0.0
    slo: str = "ttft=500ms,itl=100ms"
    prices: str = ""
    timeout_s: float = 300.0
    json: str | None = None
    charts: str = ""
    self_test: bool = False
    ceiling_s: float = 2.0
    soak: str = ""
    sample_s: float = 10.0
    pid: list[str] = field(default_factory=list)
    pids_from: str = ""
    logs: str = ""


@dataclass(frozen=True)
class Step:
    label: str
    rate_rps: float = 0.0  # open loop; 0 for a closed loop
    concurrency: int = 0  # closed loop
    seconds: float = 0.0
    soak: bool = False


class Progress:
    """Counters for the live line on stderr: sent, done, in flight, errors, current sending rate."""

    def __init__(self) -> None:
        self.sent = 0
        self.done = 0
        self.errors = 0
        self.step = ""
        self.recent_sends: deque[float] = deque()

    def on_send(self) -> None:
        self.sent += 1
        self.recent_sends.append(time.perf_counter())

    def on_done(self, sample: Sample) -> None:
        self.done += 1
        self.errors += not sample.ok

    def line(self) -> str:
        now = time.perf_counter()
        while self.recent_sends and self.recent_sends[0] < now - 2.0:
            self.recent_sends.popleft()
        rate = len(self.recent_sends) / 2.0
        in_flight = self.sent - self.done
        return (
            f"[{self.step}] sent {self.sent}  done {self.done}  in flight {in_flight}  "
            f"errors {self.errors}  rate {rate:.1f}/s"
        )

    def print(self, final: bool = False) -> None:
        """On a terminal, one line rewritten in place; in a log, a line each time."""
        tty = sys.stderr.isatty()
        end = "\n" if final or not tty else ""
        line = ("\r" + self.line() + "  ") if tty else self.line()
        print(line, end=end, file=sys.stderr, flush=True)

    async def show(self) -> None:
        while True:
            await asyncio.sleep(0.5 if sys.stderr.isatty() else 5.0)
            self.print()


class LoadRun:
    def __init__(self, settings: LoadBench, targets: list[Target], steps: list[Step]) -> None:
        self.settings = settings
        self.targets = targets
        self.steps = steps
        self.mix = prompt_mix(settings)
        self.slo = Slo.parse(settings.slo)
        self.prices = (
            Prices.from_edge_config(Path(settings.prices), settings.model) if settings.prices else None
        )
        self.samples: list[Sample] = []
        self.summaries: list[StepSummary] = []
        self.progress = Progress()
        self.run_started = 0.0
        self.sampler: Sampler | None = None

    async def run(self) -> None:
        self.run_started = time.perf_counter()
        prompts = [self.mix.requests() for _ in self.targets]  # same prompts, same order, per target
        sessions = [_session(target, self.settings.timeout_s) for target in self.targets]
        shower = asyncio.create_task(self.progress.show())
        try:
            for index, step in enumerate(self.steps):
                self.progress.step = step.label
                await self._step(index, step, sessions, prompts)
                self.progress.print(final=True)  # each step's last counts stay on screen
        finally:
            shower.cancel()
            for session in sessions:
                await session.close()

    async def _step(
        self,
        index: int,
        step: Step,
        sessions: list[aiohttp.ClientSession],
        prompts: list[Iterator[LoadRequest]],
    ) -> None:
        sampling = None
        if step.soak and self.sampler is not None:
            sampling = asyncio.create_task(self.sampler.run())
        started = time.perf_counter()
        try:
            if step.rate_rps:
                samples = await self._open(index, step, sessions, prompts, started)
            else:
                samples = await self._closed(step, sessions, prompts, started)
        finally:
            if sampling is not None:
                sampling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampling
        duration_s = time.perf_counter() - started
        self.samples += samples
        for target in self.targets:
            mine = [s for s in samples if s.endpoint == target.name]
            summary = summarize(
                mine,
                endpoint=target.name,
                step=step.label,
                offered_rps=step.rate_rps or math.nan,
                duration_s=duration_s,
                slo=self.slo,
                prices=self.prices,
            )
            self.summaries.append(summary)

    async def _open(
        self,
        index: int,
        step: Step,
        sessions: list[aiohttp.ClientSession],
        prompts: list[Iterator[LoadRequest]],
        started: float,
    ) -> list[Sample]:
        # Each endpoint its own seeded arrivals (seeded apart per step and endpoint), merged in time.
        schedule = sorted(
            (offset, i)
            for i in range(len(self.targets))
            for offset in OpenLoop(step.rate_rps, self.settings.burstiness, self._seed(index, i)).offsets_s(
                step.seconds
            )
        )
        tasks = []
        for offset_s, i in schedule:
            due = started + offset_s
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._send(i, sessions[i], next(prompts[i]), due)))
        return list(await asyncio.gather(*tasks))

    async def _closed(
        self,
        step: Step,
        sessions: list[aiohttp.ClientSession],
        prompts: list[Iterator[LoadRequest]],
        started: float,
    ) -> list[Sample]:
        samples: list[Sample] = []
        end = started + step.seconds
        loop = ClosedLoop(step.concurrency)

        async def worker(i: int) -> None:
            while time.perf_counter() < end:
                samples.append(await self._send(i, sessions[i], next(prompts[i]), time.perf_counter()))

        await asyncio.gather(*(worker(i) for i in range(len(self.targets)) for _ in range(loop.concurrency)))
        return samples

    def _seed(self, step_index: int, target_index: int) -> int:
        return (self.settings.seed or 0) * 1_000_003 + step_index * 101 + target_index

    async def _send(self, i: int, session: aiohttp.ClientSession, request: LoadRequest, due: float) -> Sample:
        target = self.targets[i]
        sample = Sample(target.name, request.kind, due - self.run_started, Stream())
        sample.lag_s = time.perf_counter() - due
        self.progress.on_send()
        url = target.url + "/v1/chat/completions"
        # Timed from the due time: a generator that falls behind shows as latency, never as a lower rate.
        await stream_once(session, url, request.body, target.headers, sample.stream, started=due)
        self.progress.on_done(sample)
        return sample


def prompt_mix(settings: LoadBench, model: str | None = None) -> PromptMix:
    return PromptMix(
        model=model or settings.model,
        system_prompts=settings.system_prompts,
        system_tokens=settings.system_tokens,
        repeat_share=settings.repeat_share,
        paraphrase_share=settings.paraphrase_share,
        input_tokens=LengthDist.parse(settings.input_tokens),
        output_tokens=LengthDist.parse(settings.output_tokens),
        temperature=settings.temperature,
        seed=settings.seed or 0,
    )


def _session(target: Target, timeout_s: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, ssl=target.ssl)
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10, sock_read=timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


def targets_of(settings: LoadBench) -> list[Target]:
    names = [f.name for f in dataclasses.fields(TargetFlags)]
    return load_targets.targets_of(TargetFlags(**{name: getattr(settings, name) for name in names}))


def steps_of(settings: LoadBench) -> list[Step]:
    if settings.soak:
        seconds = parse_duration_s(settings.soak)
        rate = settings.rate or (parse_rates(settings.rates)[0] if settings.rates else 0.0)
        if not rate:
            raise ValueError("--soak needs --rate (or --rates: its first)")
        return [Step(f"soak {rate:g} rps", rate_rps=rate, seconds=seconds, soak=True)]
    rates = parse_rates(settings.rates) if settings.rates else ([settings.rate] if settings.rate else [])
    if settings.rate < 0:
        raise ValueError("--rate must be positive")
    levels = [int(c) for c in settings.concurrency.split(",") if c.strip()] if settings.concurrency else []
    if any(c < 1 for c in levels):
        raise ValueError("--concurrency levels must be at least 1")
    if not rates and not levels:
        raise ValueError("give --rate, --rates or --concurrency")
    if settings.seconds <= 0:
        raise ValueError("--seconds must be positive")
    steps = [Step(f"{rate:g} rps", rate_rps=rate, seconds=settings.seconds) for rate in rates]
    return steps + [Step(f"closed {c}", concurrency=c, seconds=settings.seconds) for c in levels]


def watched_pids(settings: LoadBench) -> dict[str, int]:
    pids = dict(parse_pid(text) for text in settings.pid)
    if settings.pids_from:
        pids.update(pids_from_run(Path(settings.pids_from).expanduser()))
    return pids


async def measure_ceiling(seconds: float, logs: Path) -> Ceiling:
    """Closed loop at CEILING_CONCURRENCY against the zero-latency server, through LoadRun's own sender."""
    url, server = load_selftest.start_server(logs / "load-selftest.log")
    try:
        settings = LoadBench(url=[url], repeat_share=0, paraphrase_share=0, slo="")
        step = Step("self-test", concurrency=CEILING_CONCURRENCY, seconds=seconds)
        run = LoadRun(settings, targets_of(settings), [step])
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        await run.run()
        wall_s = time.perf_counter() - wall_before
        cpu_share = (time.process_time() - cpu_before) / wall_s
    finally:
        server.stop()
    summary = run.summaries[0]
    return Ceiling(
        requests_per_s=summary.request_rps,
        tokens_per_s=summary.output_tokens_per_s,
        concurrency=CEILING_CONCURRENCY,
        seconds=seconds,
        client_cpu_share=cpu_share,
        errors=summary.sent - summary.ok,
    )


def knees(summaries: list[StepSummary]) -> dict[str, float]:
    """Per endpoint, the highest offered rate at which at least KNEE_SHARE of the requests sent met the
    objectives (a share, not goodput over offered rate: a short step's Poisson count would blur that)."""
    out: dict[str, float] = {}
    for s in summaries:
        if math.isnan(s.offered_rps) or s.step.startswith("soak"):
            continue
        best = out.setdefault(s.endpoint, math.nan)
        if s.slo_met_share >= KNEE_SHARE and (math.isnan(best) or s.offered_rps > best):
            out[s.endpoint] = s.offered_rps
    return out


def _install_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run(settings: LoadBench) -> LoadReport:
    """Everything ``bench load`` does: ceiling, steps, table on stdout, JSON and charts where asked."""
    _install_uvloop()
    if settings.seed is None:
        settings = dataclasses.replace(settings, seed=secrets.randbelow(1 << 31))
    logs = Path(settings.logs) if settings.logs else Path(tempfile.mkdtemp(prefix="nearshore-load-"))
    ceiling = None
    if settings.self_test or settings.ceiling_s > 0:
        seconds = max(settings.ceiling_s, 5.0) if settings.self_test else settings.ceiling_s
        ceiling = asyncio.run(measure_ceiling(seconds, logs))
    summaries: list[StepSummary] = []
    growth: list[Growth] = []
    samples: list[Sample] = []
    if not settings.self_test:
        steps = steps_of(settings)
        load = LoadRun(settings, targets_of(settings), steps)
        pids = watched_pids(settings)
        if steps[0].soak:
            load.sampler = Sampler(pids, settings.sample_s)
        asyncio.run(load.run())
        summaries, samples = load.summaries, load.samples
        growth = load.sampler.growth() if load.sampler is not None else []
    report = LoadReport(ceiling, summaries, knees(summaries), growth, settings=_settings_json(settings))
    print(load_report.format_report(report))
    if settings.json:
        Path(settings.json).write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2))
    if settings.charts and samples:
        written = load_charts.write_charts(Path(settings.charts), samples, summaries)
        print("charts: " + ", ".join(str(p) for p in written))
    return report


def _settings_json(settings: LoadBench) -> dict:
    values = dict(vars(settings))
    values["api_key"] = ["<set>" for _ in settings.api_key]  # never a secret in a report
    return values
