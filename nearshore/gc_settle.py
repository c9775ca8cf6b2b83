"""The garbage collector of a long-running server, once it has started.

Python's cyclic collector scans the young generation every 700 allocations, and every tenth and hundredth
of those scans the older generations, start-up's objects included (an edge holds some 100k: config,
catalog, caches, compiled patterns) though they never become garbage. Under a stream's load that was 7% of
an edge's CPU (0.28 s of 3.95 s, bench edge at 50 streams; a non-streamed load 0.74 of 8.5 s). Once serving,
what start-up made is frozen out of every scan and the young generation is scanned every 20,000
allocations: a request's short-lived cycles wait a little longer to be freed (a few MB at most)."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # allocations between scans of the young generation (Python's default: 700)
OLDER_THRESHOLDS = (20, 20)  # young scans per scan of the middle generation, middle per old (10, 10)


def settle_after_start() -> None:
    """Free what start-up left as garbage, then keep the rest out of later scans."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
