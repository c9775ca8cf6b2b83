"""One short request through a freshly loaded model before the node says it is ready.

The first step of a fresh model costs about twice a later one (its compute buffers are allocated and its
weights' pages touched on first use: on the embedded model, a first token after 58 ms against 30 ms for the
next requests). Without a warm-up the first user after every start or restart pays that, and the edge's
router, measuring that first answer, finds the node slow at the very moment it came back and sends its
traffic elsewhere until the measurement goes stale.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from regional.engine import GenerationRequest
from regional.llama_model import LlamaModel
from regional.sampler import TokenSampler
from regional.scheduler import Scheduler
from regional.sequence import Sequence

WARM_UP_ID = "nearshore-warm-up"
WARM_UP_TOKENS = 2  # a prefill step and a decode step: both kinds of batch have run once


def warm_up(vocab: LlamaModel, scheduler: Scheduler, step: Callable[[], object]) -> int:
    """Run a short greeting through ``scheduler`` with ``step`` until it has finished; the steps taken."""
    prompt = [*vocab.bos_prefix(), *vocab.tokenize("Hello", add_special=False)]
    request = GenerationRequest(WARM_UP_ID, prompt, max_tokens=WARM_UP_TOKENS)
    scheduler.add(Sequence(request, time.perf_counter(), TokenSampler(request.sampling, prompt)))
    steps = 0
    while scheduler.has_work:
        step()
        steps += 1
    return steps
