"""One short request, then one measured prompt, through a freshly loaded model before the node says it is
ready.

The first step of a fresh model costs more than a later one (buffers allocated and weights' pages touched
on first use; on a GPU, the runtime's lazy initialisation). Without a warm-up the first user after every
start or restart pays it: on the embedded model with llama.cpp, six different prompts on a fresh node had
their first token after 58 and 73 ms for the first (two nodes) against 29-52 ms for the rest; with the
warm-up, 44 and 46 ms against 37-58 ms. The measured prompt's step gives the node's first estimate of its
prefill cost (below).
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
# Then, warm, one prompt of this many tokens: its step and the decode step before it are the node's first
# estimate of its prefill cost (StepCost.two_point), reported until its steps are fitted, so that the edge
# does not take a fresh CPU node's first long prompt for a queue at the configured prefill speed.
MEASURED_PROMPT_TOKENS = 64
WARM_UP_STEPS = 3


def warm_up(vocab: LlamaModel, scheduler: Scheduler, step: Callable[[], object]) -> int:
    """Run a short greeting, then a measured prompt, through ``scheduler`` with ``step`` until they have
    finished; the steps taken."""
    greeting = [*vocab.bos_prefix(), *vocab.tokenize("Hello", add_special=False)]
    measured = [*vocab.bos_prefix(), *vocab.tokenize(" the" * MEASURED_PROMPT_TOKENS, add_special=False)]
    steps = 0
    for n, (prompt, max_tokens) in enumerate(((greeting, WARM_UP_TOKENS), (measured, 1))):
        request = GenerationRequest(f"{WARM_UP_ID}-{n}", prompt, max_tokens=max_tokens)
        scheduler.add(Sequence(request, time.perf_counter(), TokenSampler(request.sampling, prompt)))
        while scheduler.has_work:
            step()
            steps += 1
    return steps
