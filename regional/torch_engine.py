"""The torch engine (``engine.kind = "gpu"``): the model of gpu/ over paged KV blocks, batched sampling.

The step loop, requests and events are :class:`regional.step_engine.StepEngine`'s, with the same
scheduler as the llama.cpp engine over a different memory: paged blocks with a prefix cache
(:mod:`regional.kv_paged`), taken as tokens are computed, with preemption when they run out. Each step
turns the plan's rows into tensors (the sequences' block tables, slots), runs :class:`gpu.model.CausalLM`
once and returns its logits, from which every row is sampled at once on the device (:mod:`gpu.sampler`),
each with the sampling row its sequence carries. On a machine without CUDA the same code runs on the CPU in
float32: slowly, and exactly what the tests check.

Prompts are tokenized by llama.cpp's vocabulary of the same GGUF (loaded without weights), so both
engines see the same tokens for the same text.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpu.sampling_rows import SamplingRow
from regional.config import EngineConfig
from regional.engine import Logprobs
from regional.gpu_probe import cuda_available
from regional.grammar import GrammarError
from regional.kv_memory import KvMemory
from regional.kv_paged import PagedMemory
from regional.kv_slots import SlotMemory
from regional.llama_model import ContextSettings, LlamaModel
from regional.sequence import Sequence
from regional.step_engine import StepEngine
from regional.step_plan import StepPlan

if TYPE_CHECKING:
    import torch

log = logging.getLogger("nearshore.engine")


class TorchEngine(StepEngine):
    kind = "gpu"

    def __init__(self, model_name: str, model_path: str, config: EngineConfig) -> None:
        import torch

        self._device = torch.device(
            ("cuda" if cuda_available() else "cpu") if config.device == "auto" else config.device
        )
        if config.dtype != "auto":
            self._dtype = getattr(torch, config.dtype)
        elif self._device.type == "cuda":
            self._dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        else:
            self._dtype = torch.float32
        self._model = None  # gpu.model.CausalLM once loaded
        self._kv = None  # gpu.kv_cache.PagedKvCache
        self._blocks = None  # gpu.kv_blocks.KvBlockManager
        self._vocab_model: LlamaModel | None = None
        self._graphs = None  # gpu.decode_graphs.DecodeGraphs, on a GPU with cuda_graphs on
        self.weights_cached = False
        super().__init__(model_name, model_path, config)

    def description(self) -> str:
        return f"gpu ({self._device.type}, {str(self._dtype).removeprefix('torch.')})"

    # --- the model --------------------------------------------------------------------------------

    def _load_backend(self) -> LlamaModel:

        from gpu.kv_cache import PagedKvCache, block_manager_for
        from gpu.model import CausalLM

        c = self.config
        vocab = LlamaModel(self.model_path, ContextSettings(0, 0, 1, 1), vocab_only=True)
        try:
            model = CausalLM.load(self.model_path, self._device, self._dtype, c.weights_cache_dir or None)
        except BaseException:
            vocab.close()
            raise
        info = model.weights_info
        self.weights_cached = bool(info is not None and info.cache_hit)
        blocks = self._pool_sizes(model.config)
        self._blocks = block_manager_for(model.config, blocks, c.block_size)
        self._kv = PagedKvCache(model.config, blocks, c.block_size, self._dtype, self._device)
        self._model = model
        self._vocab_model = vocab
        self._graphs = self._capture_graphs(model)
        log.info(
            "%s: weights %s, KV %d MiB in blocks of %d tokens %s",
            self.description(),
            "from the converted-weights cache" if self.weights_cached else "converted from the GGUF",
            self._kv.total_bytes >> 20,
            c.block_size,
            blocks,
        )
        return vocab

    def _capture_graphs(self, model):
        """Decode steps as CUDA graphs at the configured batch sizes (GPU with the CUDA kernels only)."""
        from gpu.decode_graphs import DecodeGraphs
        from gpu.model import decode_kernel_usable

        c = self.config
        if not c.cuda_graphs or not decode_kernel_usable(self._device):
            return None
        sizes = [b for b in c.cuda_graph_batch_sizes if b <= c.max_sequences] or [c.max_sequences]
        width = math.ceil(c.context_window / c.block_size) + 1
        graphs = DecodeGraphs(
            model, self._kv, sizes, dict.fromkeys(model.config.groups, width), c.context_window
        )
        log.info("decode steps captured as CUDA graphs at batch sizes %s", graphs.sizes)
        return graphs

    def _pool_sizes(self, model_config) -> dict[str, int]:
        """Blocks per attention group: the full-attention pools hold ``kv_cache_tokens``; a sliding pool
        needs only each running sequence's window (plus the block being filled), twice over so that
        recent prefixes stay cached."""
        c = self.config
        full = math.ceil(c.kv_cache_tokens / c.block_size) + 1  # + the null block
        sizes = {}
        for group in model_config.groups:
            window = model_config.window_of(group)
            if window:
                per_sequence = math.ceil(window / c.block_size) + 2
                sizes[group] = min(full, 2 * c.max_sequences * per_sequence + 1)
            else:
                sizes[group] = full
        return sizes

    def _close_backend(self) -> None:
        self._model = self._kv = self._blocks = self._graphs = None
        if self._vocab_model is not None:
            self._vocab_model.close()
            self._vocab_model = None
        if self._device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _new_memory(self) -> KvMemory:
        if self._blocks is None:  # not loaded yet: a stand-in that only answers stats()
            return SlotMemory(self.config.max_sequences, self.config.kv_cache_tokens)
        self._blocks.reset()
        return PagedMemory(self._blocks)

    # --- a step -----------------------------------------------------------------------------------

    def _run_model(self, plan: StepPlan) -> DeviceLogits:
        from gpu.step_inputs import build_step_inputs, chunks_from_rows

        assert self._model is not None and self._blocks is not None
        tables = {seq.slot: seq.blocks for seq, _ in plan.advances}
        chunks = chunks_from_rows(plan.tokens, plan.positions, plan.seq_ids, plan.want_logits, tables)
        inputs = build_step_inputs(chunks, self._blocks.groups).to(self._device)
        size = self._graphs.size_for(inputs) if self._graphs is not None else None
        values = self._graphs.run(inputs, size) if size is not None else self._model.forward(inputs, self._kv)
        wanted = (row for row, want in enumerate(plan.want_logits) if want)
        return DeviceLogits(values, {row: i for i, row in enumerate(wanted)})

    def _sample(
        self, plan: StepPlan, logits: DeviceLogits
    ) -> tuple[list[int | None], list[Logprobs | None], dict[Sequence, str]]:
        import torch

        from gpu.sampler import sample

        if not plan.samples:
            return [], [], {}
        failures: dict[Sequence, str] = {}
        bitmask = self._grammar_masks(plan, failures)
        samples = [(seq, row) for seq, row in plan.samples if seq not in failures]
        seqs = [seq for seq, _row in samples]
        rows = [sampling_row(seq) for seq in seqs]
        index = [logits.index[row] for _seq, row in samples]
        drawn: dict[Sequence, tuple[int, Logprobs | None]] = {}
        if seqs:
            try:
                masks = None
                if bitmask is not None:
                    keep = [i for i, (seq, _row) in enumerate(plan.samples) if seq not in failures]
                    masks = torch.from_numpy(bitmask[keep]).to(logits.values.device, non_blocking=True)
                result = sample(logits.values[index], rows, masks)
            except Exception as exc:  # one batched draw: it fails for every row of the step
                log.error("sampling failed for %d sequences", len(seqs), exc_info=True)
                failures.update(dict.fromkeys(seqs, f"sampling failed: {exc}"))
            else:
                for seq, token, row, scored in zip(seqs, result.tokens, rows, result.logprobs, strict=True):
                    row.output_counts[token] = row.output_counts.get(token, 0) + 1
                    drawn[seq] = (token, None if scored is None else Logprobs(token, scored[0], scored[1]))
        tokens = [drawn[seq][0] if seq in drawn else None for seq, _row in plan.samples]
        logprobs = [drawn[seq][1] if seq in drawn else None for seq, _row in plan.samples]
        return tokens, logprobs, failures

    def _grammar_masks(self, plan: StepPlan, failures: dict[Sequence, str]) -> np.ndarray | None:
        """The step's bitmask [samples, words] (all ones for an unconstrained row), or None when no row
        is constrained; a row whose grammar fails is a failure of that sequence alone."""
        constrained = [(i, seq) for i, (seq, _row) in enumerate(plan.samples) if seq.constraint is not None]
        if not constrained:
            return None
        assert self._vocab_model is not None
        words = (self._vocab_model.n_vocab + 31) // 32
        bitmask = np.full((len(plan.samples), words), -1, dtype=np.int32)
        for i, seq in constrained:
            assert seq.constraint is not None
            try:
                mask = seq.constraint.mask()
                if mask is not None:  # None: a lazy grammar not yet triggered leaves the row free
                    bitmask[i] = mask
            except GrammarError as exc:  # its grammar allows nothing more: the request's own error
                log.warning("request %s: %s", seq.request_id, exc)
                failures[seq] = str(exc)
            except Exception as exc:
                failures[seq] = f"sampling failed: {exc}"
        return bitmask


@dataclass(frozen=True, slots=True)
class DeviceLogits:
    """One model call's logits, on the device: ``values`` [rows wanted, vocab], ``index`` from a batch row
    to its row of ``values``."""

    values: torch.Tensor
    index: dict[int, int]

    def row(self, batch_row: int) -> np.ndarray:
        return self.values[self.index[batch_row]].float().cpu().numpy()


def sampling_row(seq: Sequence) -> SamplingRow:
    """``seq``'s row of the batched sampler for this draw: made at its first (holding the request's params,
    its seed fixed there), kept on the sequence (preemptions too), its counter moved to the token being
    drawn."""
    row = seq.sampling_row
    if row is None:
        params = seq.request.sampling
        row = seq.sampling_row = SamplingRow(
            params,
            seed=params.seed if params.seed is not None else random.getrandbits(64),
            prompt_tokens=seq.prompt,
            logprobs=seq.request.logprobs,
        )
    # The draw's counter is the index of the token drawn: a seeded stream is the same whatever batches
    # and preemptions it met.
    row.index = len(seq.output)
    return row
