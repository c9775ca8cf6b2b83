"""The degraded tier: what answers when the cables are cut (README, "When the cables are cut").

Regions marked ``local = true`` are on this side of the ocean (the last mile only). The router leaves them
out of a model's ranking while any remote replica of it is routable and puts them last in its failover
order (``degraded.traffic = "standby"``), or ranks them with the others (``"share"``; geo/route.py). The
cut stage (edge/stages/cut.py: after admission, before the cache) decides once whether every remote replica
of the request's model is down or ejected by the probes, and the policy for it (edge/degraded_policy.py: by
key tier and model); the stages after it read its record (``journey.cut``). While they are out, the edge
answers, in this order:

1. from the response cache, as its policy allows any request (an exact hit at once; a semantic lookup is
   awaited before the local tier is asked, rather than raced against it): a request the cache does not
   keep (sampled, tools, ``no-cache``) is not looked up in a cut either;
2. from the model's own local replicas, when a local region serves it;
3. from the stand-in (``degraded.model``, a local model) in place of a model no local region serves, when
   the policy allows it: by default for a size alias's request and a small-pool model, never for a model
   named explicitly unless a rule for the key's tier says ``substitute = "always"``;
4. else at once (the probes already know: no request waits for timeouts) a 503 ``cable_cut`` with
   ``Retry-After``.

Remote replicas that are up by the probes but fail a request now (a blackholed link) are tried first; the
local tier is the last of the failover order, then of the fallbacks (the stand-in, on its local replicas
only). A stream whose remote region died mid-answer is continued on the local tier the same way.

Each answer the degraded tier gives says so: ``x-nearshore-degraded: cable-cut``, ``x-nearshore-model``
naming the model that answered, the ledger row's ``degraded``, and ``nearshore_edge:degraded_answers``
(``by``: cache, local, or none for a refusal). When the links are back, the probes bring the remote
replicas back and standby traffic goes to them from the next request on.
"""

from __future__ import annotations

from edge.attempts import Target
from edge.degraded_policy import REASON
from edge.fallbacks import targets
from edge.journey import Journey
from edge.opened import Opened
from edge.stream_reply import StreamReply
from nearshore.protocol.errors import CABLE_CUT, ApiError
from nearshore.protocol.headers import DEGRADED, MODEL


def answered_by(journey: Journey, by: str, model: str = "") -> None:
    """The degraded tier answers (``by``: cache, local; ``model``: the one that did) or refuses (none):
    the answer and its row say so."""
    call = journey.call
    assert call is not None
    journey.cut.by = by
    call = call.with_client_header(DEGRADED, REASON)
    if model and MODEL not in call.client_headers:
        call = call.with_client_header(MODEL, model)
    journey.call = call


def stand_ins(journey: Journey, chain: list[str]) -> list[Target]:
    """The stand-in model on its local replicas (the remote ones are no answer to a cut), when the request
    may have it and its chain does not already name it."""
    model = journey.cut.stand_in
    if not model or model in chain:
        return []
    found = targets(journey, [model])
    for target in found:
        target.upstreams = [u for u in target.upstreams if u.replica.local]
    return found


def may_answer(journey: Journey, chain: list[str]) -> bool:
    """Whether a fallback or the stand-in has a replica to ask (the request's own model has none)."""
    return any(t.upstreams for t in targets(journey, chain) + stand_ins(journey, chain))


def cut_off(journey: Journey) -> ApiError:
    """The 503 for a request nothing on this side of the ocean may answer."""
    state, body = journey.state, journey.body
    assert body is not None and state.degraded is not None
    answered_by(journey, "none")
    stand_in = state.degraded.stand_in
    hint = f", or ask for {stand_in!r}, which a local region serves" if stand_in else ""
    why = journey.routed.unrouted or f"Every remote region serving {body.model!r} is unreachable."
    return ApiError(
        CABLE_CUT,
        f"{why} No model on this side of the ocean may answer for it to this key: retry later{hint}.",
        retry_after_s=state.config.degraded.retry_after_s,
        headers={DEGRADED: REASON},
    )


def answered_locally(journey: Journey, opened: Opened) -> None:
    """A local replica answers: in the remote regions' place, unless they are up and its traffic is
    shared (or the model has no remote region at all)."""
    cut, body = journey.cut, journey.body
    assert body is not None
    if not cut.served_remotely or not opened.upstream.replica.local:
        return
    if opened.model == body.model and cut.share_local and not cut.remote_out:
        return
    answered_by(journey, "local", opened.model)
    stream = journey.forwarded.stream
    if isinstance(stream, StreamReply):
        stream.head(DEGRADED, REASON)
        stream.head(MODEL, opened.model, replace=False)
