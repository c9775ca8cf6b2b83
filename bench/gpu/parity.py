"""Teacher-forced parity of the torch model with llama.cpp on the same GGUF.

Both engines read the same token sequences; at every position their next-token distributions are compared:
top-1 agreement and KL(llama.cpp || torch). Free-running greedy text is no test (llama.cpp's own greedy text
drifts with the batch size). Three comparisons, because llama.cpp's arithmetic on a quantised file (weights
times activations rounded to 8 bits, keys and values in fp16) moves distributions by itself:
- exact: llama.cpp in fp32 (the GGUF's F32 copy, fp32 KV) against torch: the architecture, to rounding;
- served: llama.cpp on the GGUF as a region runs it against torch;
- llama_self: llama.cpp as served against llama.cpp with only the KV precision changed: its noise floor.
The full check (20 prompts with sampled continuations, plus one long sequence past the sliding window: 2k+
positions) is `teacher_forced_parity`; `nearshore gpu-check` runs it on a GPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu.gguf_weights import cache_entry
from gpu.kv_cache import DEFAULT_BLOCK_SIZE, PagedKvCache
from gpu.model import CausalLM
from gpu.step_inputs import StepInputs

PROMPTS = (
    "The history of the printing press begins",
    "Here is a simple recipe for jollof rice:",
    "The main causes of the First World War were",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Photosynthesis is the process by which plants",
    "Dear hiring manager, I am writing to apply for",
    "The three laws of thermodynamics state that",
    "Lagos is the largest city in Nigeria and",
    "Q: What is the difference between a virus and a bacterium?\nA:",
    "In the year 2150, the first colony on Mars",
    "SELECT name, COUNT(*) FROM orders",
    "The best way to learn a new language is",
    "Once upon a time, in a village by the sea,",
    "A binary search tree is a data structure that",
    "The stock market fell sharply on Monday after",
    "To change a flat tyre, first",
    "Nairobi's climate is mild because",
    "Les avantages du télétravail sont",
    "The theory of evolution by natural selection",
    "An API rate limiter can be implemented with",
)


@dataclass
class ParityReport:
    positions: int = 0
    top1_agree: int = 0
    kl_sum: float = 0.0
    max_kl: float = 0.0
    sequences: list[tuple[int, float, float]] = field(default_factory=list)  # (length, top-1 share, mean KL)
    seconds: float = 0.0

    @property
    def top1(self) -> float:
        return self.top1_agree / max(self.positions, 1)

    @property
    def mean_kl(self) -> float:
        return self.kl_sum / max(self.positions, 1)

    def add(self, reference: torch.Tensor, other: torch.Tensor) -> None:
        """Count one sequence's positions: the log-probabilities (:func:`log_probs`) of the reference
        (llama.cpp) and of the other, both [n, vocab]."""
        agree, kl = compare_log_probs(reference, other)
        self.positions += len(kl)
        self.top1_agree += int(agree.sum())
        self.kl_sum += float(kl.sum())
        self.max_kl = max(self.max_kl, float(kl.max(initial=0.0)))
        self.sequences.append((len(kl), float(agree.mean()), float(kl.mean())))

    def summary(self) -> str:
        return (
            f"{self.positions} positions in {len(self.sequences)} sequences: top-1 agreement "
            f"{100 * self.top1:.2f}%, KL(reference || other) mean {self.mean_kl:.2e} max {self.max_kl:.2e}"
        )


def log_probs(logits: np.ndarray, rows: int = 8) -> torch.Tensor:
    """Log-probabilities [n, vocab] in float64, the form every comparison reads (made once per array: a
    262k vocabulary makes this most of a comparison's cost). Worked a few rows at a time: whole, the float64
    temporaries of 700 rows are gigabytes, and their page faults cost as much as the arithmetic."""
    source = torch.as_tensor(logits)
    out = torch.empty(source.shape, dtype=torch.float64)
    for start in range(0, len(source), rows):
        out[start : start + rows] = torch.log_softmax(source[start : start + rows].double(), dim=-1)
    return out


def compare_log_probs(ref: torch.Tensor, got: torch.Tensor, rows: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Per row: does the top-1 token agree, and KL(ref || got) in nats (a few rows at a time, as above)."""
    kl = torch.cat(
        [(r.exp() * (r - g)).sum(-1) for r, g in zip(ref.split(rows), got.split(rows), strict=True)]
    )
    agree = ref.argmax(-1) == got.argmax(-1)
    return agree.numpy(), kl.clamp_min(0.0).numpy()


def compare_logits(reference: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: does the top-1 token agree, and KL(reference || logits) in nats (float64)."""
    return compare_log_probs(log_probs(reference), log_probs(logits))


def torch_logits(
    model: CausalLM,
    tokens: Sequence[int],
    logit_from: int = 0,
    chunk_tokens: int = 128,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> np.ndarray:
    """Logits [n - logit_from, vocab] at positions logit_from.. of one sequence, prefilled in chunks.

    Blocks are laid out in order (position p in block 1 + p // block_size): this checks the model, not the
    block manager; chunks keep the logits of one step small (a 262k vocabulary is 1 MiB per row).
    """
    n = len(tokens)
    blocks = -(-n // block_size)
    kv = PagedKvCache(model.config, blocks + 1, block_size, model.dtype, model.device)
    table = torch.arange(1, blocks + 1, dtype=torch.int32)[None, :]
    out = np.empty((n - logit_from, model.config.vocab_size), dtype=np.float32)
    device = model.device
    for start in range(0, n, chunk_tokens):
        end = min(start + chunk_tokens, n)
        positions = torch.arange(start, end)
        slots = positions + block_size  # block 0 is the null block
        first_row = min(max(logit_from - start, 0), end - start)
        inputs = StepInputs(
            tokens=torch.tensor(tokens[start:end], dtype=torch.int64, device=device),
            positions=positions.to(device),
            query_start=torch.tensor([0, end - start], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([end], dtype=torch.int32, device=device),
            block_tables={g: table.to(device) for g in model.config.groups},
            slot_mapping={g: slots.to(device) for g in model.config.groups},
            logit_rows=torch.arange(first_row, end - start, device=device),
            max_query_len=end - start,
            max_seq_len=end,
        )
        logits = model(inputs, kv)
        if len(logits):
            out[start + first_row - logit_from : end - logit_from] = logits.cpu().numpy()
    return out


def open_llama(gguf_path: str | Path, n_ctx: int, f32_kv: bool = False) -> Any:
    """llama.cpp over the GGUF; f32_kv: keys and values in fp32, not fp16. Its logits are read with
    :func:`llama_cpp_logits`, which asks for the rows it needs (the Llama keeps none of its own)."""
    import llama_cpp

    precision = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if f32_kv else {}
    return llama_cpp.Llama(str(gguf_path), n_ctx=n_ctx, n_batch=512, verbose=False, **precision)


def llama_cpp_logits(llm: Any, tokens: Sequence[int], logit_from: int = 0) -> np.ndarray:
    """llama.cpp's logits [n - logit_from, vocab] at positions logit_from.. of one sequence.

    Only those rows are asked of llama.cpp (a batch's per-token logits flags): the output projection of a
    262k vocabulary is most of a position's cost, and the rows before ``logit_from`` are only context."""
    import llama_cpp

    llm.reset()  # the Llama's own record of its tokens; the KV cells are cleared below
    ctx, n_vocab, n_batch = llm.ctx, llm.n_vocab(), llm.n_batch
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    out = np.empty((len(tokens) - logit_from, n_vocab), dtype=np.float32)
    batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
    try:
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start : start + n_batch]
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = start + i >= logit_from
            if (rc := llama_cpp.llama_decode(ctx, batch)) != 0:
                raise RuntimeError(f"llama_decode failed (rc={rc})")
            for i in range(max(logit_from - start, 0), len(chunk)):
                row = llama_cpp.llama_get_logits_ith(ctx, i)
                out[start + i - logit_from] = np.ctypeslib.as_array(row, shape=(n_vocab,))
    finally:
        llama_cpp.llama_batch_free(batch)
    return out


def sample_continuation(llm: Any, prompt: Sequence[int], max_tokens: int, seed: int) -> list[int]:
    """A sampled (temperature 0.8) continuation: varied text, unlike greedy loops; reproducible by seed."""
    llm.reset()
    llm.set_seed(seed)
    out: list[int] = []
    for token in llm.generate(list(prompt), temp=0.8, top_k=40, top_p=0.95, repeat_penalty=1.0):
        if llm.token_eos() == token or len(out) >= max_tokens:
            break
        out.append(int(token))
    return out


def write_dequantized_gguf(source: str | Path, target: str | Path) -> Path:
    """A copy of the GGUF with every tensor in F32 (the values the torch model computes with), same metadata.

    llama.cpp multiplies quantised weights by activations quantised to 8 bits (and keeps keys and values in
    fp16), which moves next-token distributions as much as any difference between two correct models. On an
    F32 copy with an fp32 KV cache it computes in fp32: parity there checks the architecture exactly.
    """
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    tmp = Path(f"{target}.{os.getpid()}.part")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for name, fld in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            writer.add_uint32(name, int(gguf.LlamaFileType.ALL_F32))
        elif fld.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, fld.contents(), fld.types[0], sub_type=fld.types[-1])
        else:
            writer.add_key_value(name, fld.contents(), fld.types[0])
    for info in reader.tensors:
        writer.add_tensor(info.name, gguf.quants.dequantize(info.data, info.tensor_type).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tmp.replace(target)


def dequantized_copy(gguf_path: str | Path, cache_root: str | Path | None = None) -> Path:
    """The GGUF's F32 copy, kept in its converted-weights cache folder (written on first use)."""
    target = cache_entry(gguf_path, cache_root) / "dequantized-f32.gguf"
    if not target.is_file():
        write_dequantized_gguf(gguf_path, target)
    return target


@dataclass
class ParityResult:
    served: ParityReport  # torch vs llama.cpp on the GGUF as a region serves it
    llama_self: ParityReport  # llama.cpp vs itself with an fp32 KV cache: its own noise floor
    exact: ParityReport | None  # torch vs llama.cpp in fp32 on the dequantised copy

    def summary(self) -> str:
        lines = [f"llama.cpp as served vs torch: {self.served.summary()}"]
        lines.append(f"llama.cpp as served vs llama.cpp with an fp32 KV cache: {self.llama_self.summary()}")
        if self.exact is not None:
            lines.append(f"llama.cpp in fp32 on the F32 copy vs torch: {self.exact.summary()}")
        return "\n".join(lines)


def compare_sequences(
    model: CausalLM,
    sequences: Sequence[Sequence[int]],
    served: Any,
    served_f32_kv: Any,
    exact: Any = None,
    logit_from: Sequence[int] | None = None,
    log: Any = print,
) -> ParityResult:
    """Teacher-forced comparison over `sequences` (positions logit_from[i].. of each) for each llama.cpp."""
    result = ParityResult(ParityReport(), ParityReport(), ParityReport() if exact is not None else None)
    started = time.perf_counter()
    for i, tokens in enumerate(sequences):
        first = logit_from[i] if logit_from else 0
        mine = log_probs(torch_logits(model, tokens, first))
        reference = log_probs(llama_cpp_logits(served, tokens, first))
        result.served.add(reference, mine)
        result.llama_self.add(reference, log_probs(llama_cpp_logits(served_f32_kv, tokens, first)))
        if exact is not None and result.exact is not None:
            result.exact.add(log_probs(llama_cpp_logits(exact, tokens, first)), mine)
        length, top1, kl = result.served.sequences[-1]
        log(f"  {len(tokens):4d} tokens, {length} positions: top-1 {100 * top1:.1f}%, mean KL {kl:.2e}")
    for report in (result.served, result.llama_self, result.exact):
        if report is not None:
            report.seconds = time.perf_counter() - started
    return result


def parity_sequences(
    llm: Any, prompts: Sequence[str], continuation_tokens: int, long_tokens: int
) -> list[list[int]]:
    """Each prompt with a sampled continuation, then one long sequence made of them all."""
    sequences: list[list[int]] = []
    for seed, prompt in enumerate(prompts):
        tokens = llm.tokenize(prompt.encode(), add_bos=True)
        sequences.append(tokens + sample_continuation(llm, tokens, continuation_tokens, seed))
    if long_tokens:
        joined = [t for seq in sequences for t in seq[1:]]
        sequences.append(sequences[0][:1] + joined[: long_tokens - 1])
    return sequences


def teacher_forced_parity(
    gguf_path: str | Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    prompts: Sequence[str] = PROMPTS,
    continuation_tokens: int = 100,
    long_tokens: int = 800,
    exact: bool = True,
    model: CausalLM | None = None,
    log: Any = print,
) -> ParityResult:
    """The full check: 20 prompts with sampled continuations, then one long sequence past Gemma 3's 512-token
    sliding window (2k+ positions). exact: also compare with llama.cpp in fp32 on the GGUF's F32 copy (written
    once, about 4 bytes a parameter). Returns the figures; the caller decides pass / fail."""
    ctx = max(long_tokens, continuation_tokens + 256)
    served = open_llama(gguf_path, ctx)
    sequences = parity_sequences(served, prompts, continuation_tokens, long_tokens)
    served_f32_kv = open_llama(gguf_path, ctx, f32_kv=True)
    exact_llm = open_llama(dequantized_copy(gguf_path), ctx, f32_kv=True) if exact else None
    model = model or CausalLM.load(gguf_path, device=device, dtype=dtype)
    result = compare_sequences(model, sequences, served, served_f32_kv, exact_llm, log=log)
    log(result.summary())
    return result
