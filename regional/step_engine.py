"""What every step engine shares: the worker thread, its step loop, requests in and events out.

One worker thread owns the model and runs the step loop: take new requests and aborts, then one step
in three calls: the scheduler plans it (``schedule``), the engine runs it (the plan's memory changes, the
model, sampling from the logits the model returned), the scheduler advances and retires (``postprocess``)
and the step's tokens become events. This class moves work and events across the thread boundary.
Requests join and leave between steps; nothing holds a global lock across a generation. The event loop
never waits on the model.

A request's state is on its :class:`~regional.sequence.Sequence`; the engine keeps only an index of the
live ones by request id (``_by_id``: an abort names a request by id, and a sequence caught between the
inbox and the scheduler when the worker dies must still be told), never state of its own for them.

A concrete engine (llama.cpp in :mod:`regional.llama_engine`, torch in :mod:`regional.torch_engine`)
supplies the model: how it loads, where its KV memory lives, how a step runs and samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import abc, deque
from collections.abc import AsyncIterator

from nearshore.protocol.prompt_segments import Segment
from regional.config import EngineConfig
from regional.engine import (
    EngineFailed,
    EngineOverloaded,
    EngineState,
    EngineStats,
    FatalHandler,
    GenerationRequest,
    Logprobs,
    TokenEvent,
)
from regional.grammar import Constraint, LazyConstraint, Vocabulary
from regional.grammar_step import GrammarStep, checked
from regional.kv_memory import KvMemory
from regional.llama_model import LlamaModel
from regional.logprobs import score_prompt_rows
from regional.prompt_tokens import PromptTokenizer
from regional.sampler import TokenSampler
from regional.scheduler import Scheduler
from regional.sequence import Sequence
from regional.step_cost import StepCost
from regional.step_output import Events, StepLogits, StepOutput, step_events
from regional.step_plan import StepPlan
from regional.token_rate import TokenRate
from regional.vocabulary_facts import VocabularyFacts
from regional.warm_up import warm_up

log = logging.getLogger("nearshore.engine")


class StepEngine(VocabularyFacts):
    kind = "?"  # which engine, for logs, /health and metrics

    def __init__(self, model_name: str, model_path: str, config: EngineConfig) -> None:
        self.model_name = model_name
        self.model_path = model_path
        self.config = config
        self.context_window = config.context_window
        self._state: EngineState = "unloaded"
        # Set once, when the engine gives up for good: it never reloads after that, the process exits.
        self._failure: str | None = None
        self.on_fatal: FatalHandler | None = None
        self._failed_steps = 0  # consecutive
        self._vocab: LlamaModel | None = None
        self._grammar_vocab: Vocabulary | None = None  # the vocabulary as the grammar engine takes it
        self._prompts: PromptTokenizer | None = None
        self._lifecycle = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Shared with the worker thread, under _cv.
        self._cv = threading.Condition()
        self._inbox: deque[Sequence] = deque()
        self._aborts: set[str] = set()
        self._by_id: dict[str, Sequence] = {}  # the live sequences (an index: their state is their own)
        self._scheduler = self._new_scheduler(_never_ends)  # no model yet: it only answers stats()
        self._steps = 0
        self._step_s = 0.0  # the steps' model, sampling and grammar time (stats)
        self._prefill_tokens = 0  # prompt tokens the steps computed (stats)
        self._prefix_queries = self._prefix_hits = 0
        self._grammars = GrammarStep()  # masks beside the model; the grammars' cost
        self._generated = TokenRate(time.monotonic())  # added to by the worker thread, read by stats()
        self._last_active = time.monotonic()
        self.model_load_s = 0.0
        self._idle_task: asyncio.Task | None = None

    # --- what a concrete engine supplies ----------------------------------------------------------------

    def _load_backend(self) -> LlamaModel:
        """Load the model (in a worker thread); returns its vocabulary: llama.cpp's, for every engine, so
        prompts tokenize the same way whichever engine decodes them."""
        raise NotImplementedError

    def _close_backend(self) -> None:
        """Free the model (the worker thread has stopped)."""
        raise NotImplementedError

    def _new_memory(self) -> KvMemory:
        raise NotImplementedError

    def _apply_memory_changes(self, plan: StepPlan) -> None:
        """What the plan's admissions change in the model's KV memory, before it runs (if at all)."""

    def _run_model(self, plan: StepPlan) -> StepLogits | None:
        """Run the model over the plan's batch; its logits, or None when the model's KV memory had no room
        for the batch and ran none of it (the scheduler makes room and retries)."""
        raise NotImplementedError

    def _sample(
        self, plan: StepPlan, logits: StepLogits
    ) -> tuple[list[int | None], list[Logprobs | None], dict[Sequence, str]]:
        """One token per sampling sequence from ``logits`` (None where its sampling failed, with the
        reason), and its log-probabilities where they were asked for."""
        raise NotImplementedError

    def _clear_memory(self) -> None:
        """A step failed: forget whatever the model's KV memory holds."""

    def _new_scheduler(self, is_end: abc.Callable[[int], bool], warm: StepCost | None = None) -> Scheduler:
        c, memory = self.config, self._new_memory()
        cost = StepCost(c.shared_step_ms, warm.two_point() if warm is not None else None)
        return Scheduler(memory, c.max_sequences, c.batch_tokens, c.prefill_chunk, is_end, cost)

    # --- lifecycle ------------------------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        thread = self._thread
        if self._state == "ready" and thread is not None and not thread.is_alive() and not self._stopping:
            # Cannot happen; never go silent if it does.
            self._fail_engine("the engine's worker thread is gone")
        return self._state

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.config.load == "eager":
            self._state = "loading"
            self._eager = asyncio.create_task(self.ready())
            # A failed load fails the engine for good (see ready()); /health says why.
            self._eager.add_done_callback(lambda task: task.cancelled() or task.exception())
        if self.config.idle_unload_s > 0:
            self._idle_task = asyncio.create_task(self._unload_when_idle())

    async def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
        async with self._lifecycle:
            await asyncio.to_thread(self._shutdown_worker)
            self._state = "unloaded"

    async def ready(self) -> None:
        """Return once the model is in memory, loading it first if it is not."""
        if self._state == "ready":
            return
        async with self._lifecycle:
            if self._failure is not None:
                raise EngineFailed(self._failure)
            if self._state == "ready":
                return
            self._state = "loading"
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self._load_and_warm_up)
            except Exception as exc:
                # What did not load will not load on the next request either (a file, more memory than
                # the machine has): give up for good, so requests get 503 with the reason, /health says
                # it, and the node exits for its supervisor, instead of serving 500s while "ok".
                log.debug("model load failed", exc_info=True)
                self._fail_engine(f"model load failed: {exc}")
                raise EngineFailed(self._failure or str(exc)) from None
            self._prompts = PromptTokenizer(self._vocab)
            self.model_load_s = time.perf_counter() - started
            log.info("model %s loaded in %.2fs (%s engine)", self.model_name, self.model_load_s, self.kind)
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name=f"{self.kind}-engine", daemon=True)
            self._thread.start()
            self._last_active = time.monotonic()
            self._state = "ready"

    def _load_and_warm_up(self) -> None:
        """Load the model and run the warm-up (regional/warm_up.py) before the worker starts; then forget its
        KV memory and scheduler, and count none of its figures (they carry on across idle reloads)."""
        self._vocab = self._load_backend()
        self._scheduler = self._new_scheduler(self._vocab.is_end_of_generation)
        kept = self._steps, self._step_s, self._prefill_tokens, self._prefix_queries, self._prefix_hits
        rate, started = self._generated, time.perf_counter()
        self._generated = TokenRate(time.monotonic())
        steps = warm_up(self._vocab, self._scheduler, self._step)
        log.debug("warmed up in %d steps, %.0f ms", steps, (time.perf_counter() - started) * 1000)
        self._steps, self._step_s, self._prefill_tokens, self._prefix_queries, self._prefix_hits = kept
        self._generated = rate
        self._clear_memory()
        self._scheduler = self._new_scheduler(self._vocab.is_end_of_generation, self._scheduler.step_cost)
        self._grammar_vocab = vocabulary = Vocabulary(self._vocab)
        # Before the node is ready (engine.grammar_vocabulary): it holds the GIL for its last second, which
        # once ready stalled every request the node had. Failed, the first structured request meets it again.
        if self.config.grammar_vocabulary == "load":
            try:
                vocabulary.tokenizer()
            except Exception:
                log.warning("the grammar engine's vocabulary could not be built", exc_info=True)

    async def _unload_when_idle(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.idle_unload_s / 2))
            idle_s = time.monotonic() - self._last_active
            if self._state != "ready" or idle_s < self.config.idle_unload_s:
                continue
            async with self._lifecycle:
                with self._cv:
                    busy = bool(self._inbox or self._scheduler.has_work)
                if busy or self._state != "ready":
                    continue
                await asyncio.to_thread(self._shutdown_worker)
                self._state = "unloaded"
                log.info("model unloaded after %.0fs idle", idle_s)

    def _shutdown_worker(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._grammars.close()
        self._prompts = None
        self._grammar_vocab = None  # it points into the vocabulary about to be freed
        if self._vocab is not None:
            self._close_backend()
            self._vocab = None

    # --- requests -------------------------------------------------------------------------------------

    async def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        await self.ready()
        assert self._vocab is not None
        return await asyncio.to_thread(self._vocab.tokenize, text, add_special)

    async def tokenize_prompt(self, segments: abc.Sequence[Segment], limit_tokens: int) -> list[int]:
        await self.ready()
        assert self._prompts is not None
        self._last_active = time.monotonic()  # the idle unloader leaves a model that is in use
        return await asyncio.to_thread(self._prompts.tokenize, segments, limit_tokens)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        await self.ready()
        grammar, trigger = request.grammar, request.grammar_trigger
        started = time.perf_counter()
        constraint = await self.constraint(grammar, trigger) if grammar is not None else None
        arrived = time.perf_counter()
        seq = Sequence(
            request,
            arrived_at=arrived,
            sampler=TokenSampler(request.sampling, request.prompt_tokens),
            events=asyncio.Queue(),
            constraint=constraint,
            grammar_s=arrived - started if constraint is not None else 0.0,
        )
        with self._cv:
            if self._failure is not None:
                raise EngineFailed(self._failure)
            if self.room() == 0:
                raise EngineOverloaded(self._retry_after_s())
            self._by_id[request.request_id] = seq
            self._inbox.append(seq)
            self._last_active = time.monotonic()
            self._cv.notify()
        assert seq.events is not None
        finished = False
        try:
            while not finished:
                event = await seq.events.get()
                finished = event.finish_reason is not None
                if event.finish_reason == "failed":
                    raise EngineFailed(event.error or "the engine failed")
                yield event
        finally:
            if not finished:
                self.abort(request.request_id)

    async def constraint(self, grammar: str, trigger: str | None = None) -> Constraint | LazyConstraint:
        """A sequence's matcher of a checked grammar, its first mask computed (see :func:`checked`)."""
        await self.ready()
        assert self._grammar_vocab is not None
        return await asyncio.to_thread(checked, self._grammar_vocab, grammar, trigger)

    def abort(self, request_id: str) -> None:
        with self._cv:
            if request_id in self._by_id:
                self._aborts.add(request_id)
                self._cv.notify()

    def room(self) -> int:
        # Sequences beyond the free slots may wait up to max_waiting (new arrivals count until admitted).
        with self._cv:
            return max(0, self.config.max_waiting - self._scheduler.beyond_free(len(self._inbox)))

    def _retry_after_s(self) -> float:  # roughly how long until the queue drains by one batch's worth
        return max(1.0, len(self._scheduler.waiting) / max(1, self.config.max_sequences))

    def stats(self) -> EngineStats:
        state = self.state
        with self._cv:
            sched = self._scheduler
            return EngineStats(
                state=state,
                running=len(sched.running),
                waiting=len(sched.waiting) + len(self._inbox),
                kv_tokens_used=sched.memory.used_tokens(),
                kv_tokens_total=sched.memory.total_tokens,
                prefix_cache_queries=self._prefix_queries,
                prefix_cache_hits=self._prefix_hits,
                steps=self._steps,
                model_load_s=self.model_load_s,
                failure=self._failure or "",
                capacity=self.config.max_sequences,
                tokens_per_s=self._generated.per_s(time.monotonic()),
                engine=self.description(),
                num_preemptions=sched.num_preemptions,
                prefill_tokens=self._prefill_tokens,
                step_s=self._step_s,
                grammar_s=self._grammars.seconds,
                grammar_tokens=self._grammars.tokens,
                max_choices=self.config.max_sequences + self.config.max_waiting,
                prefill_ms_per_token=sched.prefill_ms_per_token(),
            )

    def description(self) -> str:
        """Which engine decodes, and on what (for the start log and /health)."""
        return self.kind

    # --- the worker thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._step_until_stopped()
        except BaseException as exc:  # the worker must never die silently: the engine fails, loudly
            log.critical("the engine's worker died; failing every request", exc_info=True)
            self._fail_engine(f"the engine's worker died: {exc!r}")
            return
        if self._failure is None:  # stopped: wake anyone still waiting, the engine is going away
            self._deliver(self._take_everyone(TokenEvent(finish_reason="error", error="engine stopped")))

    def _step_until_stopped(self) -> None:
        sched = self._scheduler
        while True:
            with self._cv:
                while not self._stopping and not self._inbox and not self._aborts and not sched.has_work:
                    self._cv.wait()
                if self._stopping:
                    return
                events = self._take_inbox_and_aborts()
            try:
                if sched.has_work:
                    events += self._step()
            except Exception as exc:
                # What failed mid-step leaves the KV memory unknown: the batch fails, as a unit.
                self._failed_steps += 1
                log.error(
                    "engine step failed (%d in a row), failing %d sequences",
                    self._failed_steps,
                    len(sched.running),
                    exc_info=True,
                )
                events += self._fail_running(f"the engine step failed: {exc}")
                if self._failed_steps >= self.config.max_failed_steps:
                    self._fail_engine(f"{self._failed_steps} engine steps failed in a row: {exc}", events)
                    return
            self._deliver(events)

    def _take_inbox_and_aborts(self) -> Events:
        sched = self._scheduler
        while self._inbox:
            sched.add(self._inbox.popleft())
        events = []
        for request_id in self._aborts:
            seq = self._by_id.pop(request_id, None)
            if seq is not None:
                sched.abort(seq, time.perf_counter())
                events.append((seq, TokenEvent(finish_reason="abort")))
        self._aborts.clear()
        return events

    def _step(self) -> Events:
        """One step: schedule, run, postprocess."""
        plan = self._scheduler.schedule(time.perf_counter())
        output = self._run_plan(plan)
        return self._postprocess(plan, output)

    def _run_plan(self, plan: StepPlan) -> StepOutput:
        """Apply the plan's memory changes, then (when anyone runs) run the model and sample its logits."""
        self._apply_memory_changes(plan)
        for a in plan.admissions:
            self._prefix_queries += len(a.sequence.prompt)
            self._prefix_hits += a.prefix_len
        if not plan.tokens:  # nobody runs: the waiting ones wait for room
            return StepOutput()
        started = time.perf_counter()
        masks = self._grammars.begin(plan)
        try:
            logits = self._run_model(plan)
        finally:
            self._grammars.ready(masks)
        if logits is None:  # nothing ran: the scheduler makes room in the next plan, which retries
            return StepOutput(model_full=True)
        self._steps += 1
        self._failed_steps = 0
        self._prefill_tokens += sum(n for seq, n in plan.advances if seq.is_prefilling)
        prompt_scores = score_prompt_rows(plan, logits.row)
        sampled, logprobs, failures = self._sample(plan, logits)
        self._grammars.advance(plan, sampled, failures)
        self._generated.add(len(sampled) - len(failures), time.monotonic())
        self._step_s += time.perf_counter() - started
        return StepOutput(True, False, started, sampled, logprobs, failures, prompt_scores)

    def _postprocess(self, plan: StepPlan, output: StepOutput) -> Events:
        """The scheduler advances and retires; the engine stops tracking whoever finished (planning
        finished some too: those that never fit) and turns the step into events."""
        sched = self._scheduler
        now = time.perf_counter()
        finished = sched.postprocess(
            plan, output.sampled, now, output.prompt_scores, model_full=output.model_full
        )
        self._untrack([*plan.finished, *finished])
        if output.ran and sched.step_cost is not None:  # what the step cost a newcomer just after it began
            scored_rows = sum(rows for _, _, rows in plan.prompt_rows)
            sched.step_cost.observe(len(plan.tokens), scored_rows, now - output.started)
        assert self._vocab is not None
        return step_events(plan, output, self._vocab, now)

    def _untrack(self, finished: list[Sequence]) -> None:
        """The scheduler retired these: the engine stops tracking them."""
        with self._cv:
            for seq in finished:
                self._by_id.pop(seq.request_id, None)
                self._aborts.discard(seq.request_id)
            self._last_active = time.monotonic()

    def _fail_running(self, message: str) -> Events:
        failed = self._scheduler.fail_running()
        self._untrack(failed)
        self._clear_memory()
        return [(seq, TokenEvent(finish_reason="error", error=message)) for seq in failed]

    def _take_everyone(self, event: TokenEvent) -> Events:
        """Every sequence the engine holds (new, waiting, running) with ``event``; none is left behind."""
        sched = self._scheduler
        with self._cv:
            # _by_id also holds a sequence caught between the inbox and the scheduler when the worker died.
            held = [*self._by_id.values(), *self._inbox, *sched.drain()]
            everyone = list({id(seq): seq for seq in held}.values())
            self._inbox.clear()
            self._by_id.clear()
            self._aborts.clear()
        return [(seq, event) for seq in everyone]

    def _fail_engine(self, reason: str, pending: Events | None = None) -> None:
        """Give up for good: every request, now and later, gets ``reason``; the node is told to exit.
        ``pending``: the last step's events (the requests that step failed get the engine's failure too)."""
        with self._cv:
            if self._failure is not None:
                return
            self._failure = reason
            self._state = "failed"
        failed = TokenEvent(finish_reason="failed", error=reason)
        last_step = [(seq, failed if e.finish_reason == "error" else e) for seq, e in pending or []]
        self._deliver(last_step + self._take_everyone(failed))
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed under us at shutdown
                self._loop.call_soon_threadsafe(self._report_fatal, reason)

    def _report_fatal(self, reason: str) -> None:
        log.critical("engine failed: %s", reason)
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def _deliver(self, events: Events) -> None:
        if events and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed under us at shutdown
                self._loop.call_soon_threadsafe(_put_all, events)


def _put_all(events: Events) -> None:
    for seq, event in events:
        if seq.events is not None:
            seq.events.put_nowait(event)


def _never_ends(_token: int) -> bool:
    return False
