"""A region's load as it reports it to edges: on every response (the ``x-nearshore-load`` header) and in its
``/health`` JSON (the ``load`` field), so that the edge's router sees queues build between two probes.

The header is one short line of ``name=value`` pairs, e.g.
``state=ready; running=3; waiting=1; capacity=8; kv=0.41; tps=212.5; choices=72; pft=2.857``. An edge trusts a
region for nothing: :func:`parse_load` never raises, ignores names it does not know (a newer region may
add some) and clamps what it reads, so a lying or broken region can at worst look busy or idle, never
crash the router.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

LoadState = Literal["ready", "loading", "unloaded", "failed"]
_STATES: frozenset[str] = frozenset(("ready", "loading", "unloaded", "failed"))
MAX_HEADER_CHARS = 256  # what parse_load reads at most
_MAX_COUNT = 1_000_000
_MAX_TPS = 1e9
_MAX_PREFILL_MS_PER_TOKEN = 1e4


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a region is doing now. ``capacity`` is how many sequences it decodes at once (0: unknown)."""

    state: LoadState = "ready"
    running: int = 0
    waiting: int = 0
    capacity: int = 0
    kv_usage: float = 0.0  # share of the KV cache in use, 0..1
    tokens_per_s: float = 0.0  # generated tokens per second, recent
    # The most choices (``n``) one request may have there, whatever the load (0: unknown): an edge refuses
    # a request that no replica could ever take as the client's error instead of sending it.
    max_choices: int = 0
    # What a prompt token costs its prefill there, in ms, as the node measures its steps (0: unknown): what
    # the edge's router subtracts for a long prompt's prefill from a first token's time there (a CPU node
    # prefills hundreds of tokens a second, a GPU tens of thousands). A node that claims to be slower than
    # it is hides at most a long prompt's queue, whose samples weigh little.
    prefill_ms_per_token: float = 0.0

    @property
    def routable(self) -> bool:
        """Whether a request sent now is served without waiting for a model load (or ever, once failed)."""
        return self.state in ("ready", "unloaded")


def format_load(report: LoadReport) -> str:
    return (
        f"state={report.state}; running={report.running}; waiting={report.waiting}; "
        f"capacity={report.capacity}; kv={report.kv_usage:.3f}; tps={report.tokens_per_s:.1f}; "
        f"choices={report.max_choices}; pft={report.prefill_ms_per_token:.4g}"
    )


def parse_load(value: str | None) -> LoadReport | None:
    """The report in a header value; None when there is none or it is not one (never raises)."""
    if not value or len(value) > MAX_HEADER_CHARS:
        return None
    fields: dict[str, object] = {}
    for part in value.split(";"):
        name, sep, raw = part.partition("=")
        if not sep:
            continue
        name, raw = name.strip(), raw.strip()
        try:
            if name == "state":
                if raw not in _STATES:
                    return None
                fields["state"] = raw
            elif name in ("running", "waiting", "capacity"):
                fields[name] = min(max(int(raw), 0), _MAX_COUNT)
            elif name == "choices":
                fields["max_choices"] = min(max(int(raw), 0), _MAX_COUNT)
            elif name == "kv":
                fields["kv_usage"] = _finite(float(raw), 0.0, 1.0)
            elif name == "tps":
                fields["tokens_per_s"] = _finite(float(raw), 0.0, _MAX_TPS)
            elif name == "pft":
                fields["prefill_ms_per_token"] = _finite(float(raw), 0.0, _MAX_PREFILL_MS_PER_TOKEN)
        except ValueError:
            return None
    if not fields:
        return None
    return LoadReport(**fields)  # type: ignore[arg-type]


def _finite(x: float, low: float, high: float) -> float:
    if math.isnan(x):
        return low
    return min(max(x, low), high)
