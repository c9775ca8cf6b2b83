"""The llama.cpp engine: continuous batching of many sequences in one ``llama_decode`` per step.

The step loop, requests and events are :class:`regional.step_engine.StepEngine`'s; this module supplies
llama.cpp: the model and its context, the KV slots with prefix reuse (:mod:`regional.kv_slots`), the
memory operations a plan implies, the decode call, and per-row sampling in numpy with each sequence's own
sampler. A batch the context has no room for is not retried here: the step reports it and the scheduler
makes room (dropping idle caches, or preempting) in the next plan.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

import numpy as np

from regional.config import EngineConfig
from regional.engine import Logprobs
from regional.grammar import GrammarError
from regional.kv_memory import KvMemory
from regional.kv_slots import SlotMemory
from regional.llama_model import ContextSettings, KvCacheFull, LlamaError, LlamaModel
from regional.logprobs import position_logprobs
from regional.sequence import Sequence
from regional.step_engine import StepEngine
from regional.step_plan import StepPlan

log = logging.getLogger("nearshore.engine")
# How LlamaModel says that llama_init_from_model failed (its allocations, the KV cache first of all).
CONTEXT_FAILED = "llama.cpp could not create a context"


def default_threads() -> int:
    """``n_threads = 0``: ``OMP_NUM_THREADS`` where the operator set it (the convention torch and BLAS follow
    too, so one variable sizes every engine of a process sharing its cores), else the cores this process may
    run on (a cpuset or ``taskset`` counts, not the whole machine)."""
    with contextlib.suppress(ValueError):
        if (omp := int(os.environ.get("OMP_NUM_THREADS", "") or 0)) > 0:
            return omp
    return len(os.sched_getaffinity(0))  # never empty: the process runs somewhere


class LlamaCppEngine(StepEngine):
    kind = "llama.cpp"

    def __init__(self, model_name: str, model_path: str, config: EngineConfig) -> None:
        threads = config.n_threads or default_threads()
        self._settings = ContextSettings(
            n_ctx=config.kv_cache_tokens,
            n_batch=config.batch_tokens,
            n_seq_max=config.max_sequences,
            n_threads=threads,
        )
        self._model: LlamaModel | None = None
        super().__init__(model_name, model_path, config)

    def _load_backend(self) -> LlamaModel:
        shown = [-1]

        def progress(fraction: float) -> None:
            tenth = int(fraction * 10)
            if tenth > shown[0]:
                shown[0] = tenth
                log.info("loading %s: %d%%", os.path.basename(self.model_path), tenth * 10)

        try:
            self._model = LlamaModel(self.model_path, self._settings, progress)
        except LlamaError as exc:
            if not str(exc).startswith(CONTEXT_FAILED):
                raise
            # Nearly always the KV pool: say which setting sized it.
            raise LlamaError(
                f"{exc}: the KV cache of engine.kv_cache_tokens = {self.config.kv_cache_tokens} may need "
                "more memory than this machine has"
            ) from None
        return self._model

    def _close_backend(self) -> None:
        if self._model is not None:
            self._model.close()
            self._model = None

    def _new_memory(self) -> KvMemory:
        return SlotMemory(self.config.max_sequences, self.config.kv_cache_tokens)

    def _apply_memory_changes(self, plan: StepPlan) -> None:
        model = self._model
        assert model is not None
        for slot in plan.cleared:  # idle caches dropped to retry a batch the context had no room for
            model.forget(slot, 0)
        for a in plan.admissions:
            for slot in a.evicted:
                model.forget(slot, 0)
            if a.source == a.slot:
                model.forget(a.slot, a.prefix_len)
            else:
                model.forget(a.slot, 0)
                if a.prefix_len:
                    model.share_prefix(a.source, a.slot, a.prefix_len)

    def _run_model(self, plan: StepPlan) -> ContextLogits | None:
        model = self._model
        assert model is not None
        try:
            model.decode(plan.tokens, plan.positions, plan.seq_ids, plan.want_logits)
        except KvCacheFull:
            # Nothing was applied; idle prefix caches may hold the cells (or split the free ones).
            log.debug("no room in the KV cache for a batch of %d tokens: making room", len(plan.tokens))
            return None
        return ContextLogits(model)

    def _sample(
        self, plan: StepPlan, logits: ContextLogits
    ) -> tuple[list[int | None], list[Logprobs | None], dict[Sequence, str]]:
        sampled: list[int | None] = []
        logprobs: list[Logprobs | None] = []
        failures: dict[Sequence, str] = {}
        for seq, row in plan.samples:
            try:
                row_logits = logits.row(row)
                mask = seq.constraint.mask() if seq.constraint is not None else None
                token = seq.sampler.sample(row_logits, mask)
                top_n = seq.request.logprobs
                logprobs.append(None if top_n is None else position_logprobs(row_logits, token, top_n))
                sampled.append(token)
            except GrammarError as exc:  # its grammar allows nothing more: the request's own error
                log.warning("request %s: %s", seq.request_id, exc)
                sampled.append(None)
                logprobs.append(None)
                failures[seq] = str(exc)
            except Exception as exc:  # this sequence's sampling alone: the others' tokens stand
                log.error("sampling failed for request %s", seq.request_id, exc_info=True)
                sampled.append(None)
                logprobs.append(None)
                failures[seq] = f"sampling failed: {exc}"
        return sampled, logprobs, failures

    def _clear_memory(self) -> None:
        assert self._model is not None
        self._model.clear()


@dataclass(frozen=True, slots=True)
class ContextLogits:
    """The last decode's logits, where llama.cpp keeps them: valid until the next decode."""

    model: LlamaModel

    def row(self, batch_row: int) -> np.ndarray:
        return self.model.logits(batch_row)
