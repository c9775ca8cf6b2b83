"""The edge's stages in order, and the pipeline they make (see ARCHITECTURE.md, "The journey of one request").

One file per stage, named after it; no stage imports another (tests/test_layout.py): what they share (asking
the regions, the stream's owner, the cache's lookup, the degraded tier, where the client is) lives below
them, and what one stage decides reaches the next as its record on the journey.

authenticate -> parse (schema, size, model) -> rightsize (a size alias's model) -> admit (budget hold,
RPM/TPM reservation; from here the request is billed) -> cut (whether the model's remote regions are all
out, and the degraded tier's policy for it: decided once) -> cache (an exact hit answers; a semantic lookup
is handed on to race the region) -> route (geo: the replicas in failover order) -> gate (a slot in the
pool, by tier) -> forward (choose and open the upstream, failover before the first byte, racing the
lookup) -> relay (the answer to the client; a stream its region cut is reported) -> continue (another
region continues a cut stream). Then, at the exit, whatever ended the journey: store (keep the answer in
the response cache) -> settle (the one bill), and the answer's last bytes.
"""

from __future__ import annotations

from edge.pipeline import Pipeline, Stage
from edge.stages.admit import admit_stage
from edge.stages.authenticate import authenticate_stage
from edge.stages.cache import cache_stage
from edge.stages.continuation import continue_stage
from edge.stages.cut import cut_stage
from edge.stages.forward import forward
from edge.stages.gate import gate_stage
from edge.stages.parse import parse_stage
from edge.stages.relay import relay
from edge.stages.rightsize import rightsize_stage
from edge.stages.route import route_stage
from edge.stages.settle import settle_stage
from edge.stages.store import store_stage


def default_pipeline() -> Pipeline:
    return Pipeline(
        [
            Stage("authenticate", authenticate_stage),
            Stage("parse", parse_stage),
            Stage("rightsize", rightsize_stage),
            Stage("admit", admit_stage),
            Stage("cut", cut_stage),
            Stage("cache", cache_stage),
            Stage("route", route_stage),
            Stage("gate", gate_stage),
            Stage("forward", forward, races=True),
            Stage("relay", relay),
            Stage("continue", continue_stage),
            Stage("store", store_stage, closes=True, best_effort=True),
            Stage("settle", settle_stage, closes=True),
        ]
    )
