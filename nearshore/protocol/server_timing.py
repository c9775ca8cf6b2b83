"""The ``Server-Timing`` header as edges, regions and the harness read it."""

from __future__ import annotations

import contextlib
import math


def parse_server_timing(header: str) -> dict[str, float]:
    """``edge;dur=0.41, ttft;desc="x";dur=12`` -> {"edge": 0.41, "ttft": 12.0} (milliseconds, by name)."""
    out: dict[str, float] = {}
    for part in header.split(","):
        name, *params = (p.strip() for p in part.split(";"))
        for param in params:
            if param.startswith("dur="):
                with contextlib.suppress(ValueError):
                    out[name] = float(param[4:])
    return out


def duration_s(header: str, name: str) -> float:
    """The header's ``name;dur=`` in seconds; 0.0 when it is absent or not a finite, positive number."""
    if name + ";" not in header:  # (most headers: no parse)
        return 0.0
    ms = parse_server_timing(header).get(name, 0.0)
    return ms / 1000 if math.isfinite(ms) and ms > 0 else 0.0
