"""When the router's first choice is not simply the best score: hysteresis and exploration.

Hysteresis keeps a client group (model, client country, residency) on its region until another wins by a
margin for ``hold_s`` (no flapping on probe noise), except from a region whose replica real requests found
slower than the challenger's whole score: a hold there would make every request pay it.

Exploration: observations go stale on a replica that lost its traffic to them. One request every
``explore_after_s`` goes to such a replica while its probes and load report alone would make it better than
the best by the switch margin; its sample after the silence replaces the stale estimate if lower (a higher
one leaves it standing: geo/latency.py), and one that finds it recovered (within the switch margin of the
group's region) moves the group there at once. Chosen over a time decay of the estimate, which would send a
whole burst of requests to a replica that may still be slow before the first of them has answered:
exploration costs one request per replica per interval, bounded however busy the edge is.

A group its region's failure moved (the region went down or out: no longer eligible) remembers it as its
home, and the home wins the group back by any lead it keeps for ``hold_s``, not by the margin: the region it
was pushed to was not chosen on merit, and between two regions closer than the margin (Lagos to London and
to Johannesburg differ by about 15%) the hold would otherwise keep the group away from the nearer one after
every outage.
"""

from __future__ import annotations

from dataclasses import dataclass

from geo.catalog import RoutingSettings
from geo.decision import Scored
from geo.terms import reported_queue_and_load

GroupKey = tuple[str, str, tuple[str, ...], bool]  # model, client country, policies, local shared
_MAX_GROUPS = 4096


@dataclass(slots=True)
class Group:
    region: str
    challenger: str = ""
    since: float = 0.0
    home: str = ""  # the region a failure moved it from: it comes back by any lead (no margin)

    def move(self, region: str) -> None:
        self.region, self.challenger = region, ""
        if region == self.home:
            self.home = ""


def hold(
    groups: dict[GroupKey, Group],
    routing: RoutingSettings,
    key: GroupKey,
    scored: list[Scored],
    now: float,
    baseline_ms: float = 0.0,
) -> tuple[list[Scored], bool]:
    """Keep the group on its region until another wins by the margin for hold_s; True when it held."""
    _, best_ms, best, _ = scored[0]
    group = groups.get(key)
    # The current region's best (first in score order) replica, if it is still eligible.
    current = next((s for s in scored if s[2].region == group.region), None) if group else None
    if group is None or current is None:
        if len(groups) >= _MAX_GROUPS:
            groups.clear()
        home = (group.home or group.region) if group is not None else ""
        groups[key] = Group(best.region, home="" if home == best.region else home)
        return scored, False
    current_ms = current[1]
    margin = max(routing.switch_margin_ms, routing.switch_margin_ratio * current_ms)
    # An exploration just measured another region's replica recovered: a real request said so, not probe
    # noise. Within the margin of the current region it wins its traffic back at once (the margin is what the
    # hold calls noise: one sample cannot say it is worse, and staying would send that request away and
    # back), without waiting hold_s (the explored request still in flight adds to its load term). Within the
    # margin of the best, that is: where a third region leads both by more, it would be a stop on the way.
    back = next(
        (s for s in scored if s[2].region != group.region and _explored_lately(s, routing, now)), None
    )
    if back is not None and back[1] < best_ms + margin:
        group.move(back[2].region)
        first = [s for s in scored if s[2].region == group.region]
        return first + [s for s in scored if s[2].region != group.region], False
    if group.region == best.region:
        group.challenger = ""
        return scored, False
    # Measured far slower: real requests there waited longer beyond the network (and the scope's baseline)
    # than the best's whole expected TTFT. Probe noise cannot do that (it moves round trips, not
    # observations): no hold.
    if current[2].latency.observed.value - baseline_ms > best_ms + margin:
        group.move(best.region)
        return scored, False
    # A challenger must lead by the margin to be noted, and keep at least half of it while it waits
    # (probe noise around the margin restarting the wait kept traffic away for tens of seconds); the home
    # a failure moved the group from, only lead.
    needed = margin / 2 if group.challenger == best.region else margin
    if best.region == group.home:
        needed = 0.0
    if best_ms + needed < current_ms:
        if group.challenger != best.region:
            group.challenger, group.since = best.region, now
        elif now - group.since >= routing.hold_s:
            group.move(best.region)
            return scored, False
    else:
        group.challenger = ""
    # The current region first (its replicas in score order), then the rest as scored.
    first = [s for s in scored if s[2].region == group.region]
    return first + [s for s in scored if s[2].region != group.region], True


def _explored_lately(s: Scored, routing: RoutingSettings, now: float) -> bool:
    """Its replica's latest sample came from an exploration within explore_after_s."""
    latency = s[2].latency
    return latency.observed.at >= latency.explored_at > now - routing.explore_after_s


def explore(routing: RoutingSettings, scored: list[Scored], now: float) -> int:
    """The place in ``scored`` of a replica to measure again with this request, or 0 (none): one whose
    observations are stale (none for explore_after_s, nor an exploration), are what makes it lose, and
    without which it would beat the first by the switch margin."""
    after_s = routing.explore_after_s
    # It must win by the switch margin without its stale queue: then a sample that confirms it moves the
    # group at once (hold), and a replica about as good as the best is not sent a request only to come back.
    best_ms = scored[0][1]
    limit_ms = best_ms - max(routing.switch_margin_ms, routing.switch_margin_ratio * best_ms)
    for j in range(1, len(scored)):
        _, total_ms, r, row = scored[j]
        latency = r.latency
        observed = latency.observed
        if not observed.samples or not observed.stale(now) or now - latency.explored_at < after_s:
            continue
        queue_ms = row[2]
        if total_ms - queue_ms >= limit_ms:  # it loses without any queue at all: cheap to rule out
            continue
        reported_ms = reported_queue_and_load(r, routing.default_service_ms)[0]
        if queue_ms > reported_ms and total_ms - queue_ms + reported_ms < limit_ms:
            latency.explored_at = now
            return j
    return 0
