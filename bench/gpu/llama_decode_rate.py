"""llama.cpp's decode rate at a batch size, measured the way bench/gpu/decode.py measures the torch engine:
``batch`` sequences of ``context_tokens`` each, one token each per step, the median step.

``nearshore gpu-check`` prints it beside the GPU engine's figures, on the same machine.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence

from regional.llama_model import ContextSettings, LlamaModel


def llama_decode_rates(
    model_path: str,
    batch_sizes: Sequence[int],
    context_tokens: int,
    steps: int,
    threads: int = 0,
    log: Callable[[str], object] = print,
) -> dict[int, float]:
    """Tokens per second per batch size (median step)."""
    largest = max(batch_sizes)
    per_seq = context_tokens + steps + 1
    n_batch = max(512, largest)
    settings = ContextSettings(
        n_ctx=largest * per_seq, n_batch=n_batch, n_seq_max=largest, n_threads=threads or os.cpu_count() or 1
    )
    model = LlamaModel(model_path, settings)
    rng = random.Random(0)
    rates = {}
    try:
        for batch in batch_sizes:
            model.clear()
            for seq in range(batch):  # prefill in chunks of n_batch (not timed)
                prompt = [rng.randrange(1, model.n_vocab) for _ in range(context_tokens)]
                for start in range(0, len(prompt), n_batch):
                    chunk = prompt[start : start + n_batch]
                    model.decode(
                        chunk,
                        list(range(start, start + len(chunk))),
                        [seq] * len(chunk),
                        [False] * len(chunk),
                    )
            times = []
            for step in range(steps):
                tokens = [(seq * 31 + step) % model.n_vocab for seq in range(batch)]
                started = time.perf_counter()
                model.decode(tokens, [context_tokens + step] * batch, list(range(batch)), [True] * batch)
                times.append(time.perf_counter() - started)
            step_s = sorted(times)[len(times) // 2]
            rates[batch] = batch / step_s
            log(f"  llama.cpp batch {batch:>4}: step {step_s * 1e3:8.2f} ms, {rates[batch]:9.1f} tok/s")
    finally:
        model.close()
    return rates
