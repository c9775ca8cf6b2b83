"""The degraded tier's policy (``[degraded]``, edge/degraded.py): by key tier and model, whether the local
regions take a request's traffic or only what the remote regions cannot, and whether the local stand-in model
may answer for a model no local region serves. Built once from the config and the catalog."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edge.config import DegradedConfig, EdgeConfig
from geo.catalog import RegionSpec

# Why the degraded tier answered (x-nearshore-degraded, the ledger's `degraded`, the metric's `reason`).
REASON = "cable-cut"


@dataclass(frozen=True, slots=True)
class Policy:
    share_local: bool  # the local regions are ranked with the remote ones (else: standby)
    stand_in: str  # the local model that may answer in the model's place ("": none may)


class DegradedTier:
    """What the policy needs from the config and the catalog: the stand-in, which models the remote regions
    serve, which are the small pool's."""

    def __init__(self, config: DegradedConfig, regions: Sequence[RegionSpec], models: Sequence[str]) -> None:
        self.config = config
        local = [spec for spec in regions if spec.local]
        self.local_models = frozenset(m for spec in local for m in spec.models or models)
        self.remote_models = frozenset(m for spec in regions if not spec.local for m in spec.models or models)
        self.small_models = frozenset(
            m for spec in regions if spec.pool == "small" for m in spec.models or models
        )
        self.stand_in = config.model or default_stand_in(local, models)

    def policy(self, tier: str, model: str, alias: str = "", key_substitutes: bool = False) -> Policy:
        """The policy for a key of ``tier`` asking for ``model`` (``alias``: the size alias that chose it;
        ``key_substitutes``: the key itself allows a substitute, whatever the rules say)."""
        c = self.config
        traffic, substitute = c.traffic, c.substitute
        traffic_set = substitute_set = False
        for rule in c.rules:
            if rule.tiers and tier not in rule.tiers:
                continue
            if rule.models and model not in rule.models and (not alias or alias not in rule.models):
                continue
            if rule.traffic is not None and not traffic_set:
                traffic, traffic_set = rule.traffic, True
            if rule.substitute is not None and not substitute_set:
                substitute, substitute_set = rule.substitute, True
        may = (
            key_substitutes
            or substitute == "always"
            or (substitute == "sized" and (bool(alias) or model in self.small_models))
        )
        stand_in = self.stand_in if may and model not in self.local_models else ""
        return Policy(traffic == "share", stand_in)


def default_stand_in(local: Sequence[RegionSpec], models: Sequence[str]) -> str:
    """The first model of a local small-pool region, else of any local region ("" without one)."""
    for spec in sorted(local, key=lambda s: s.pool != "small"):
        served = spec.models or models
        if served:
            return served[0]
    return ""


def make_degraded(config: EdgeConfig) -> DegradedTier | None:
    """The tier, or None when no region is local (the policy then has nothing to decide)."""
    if not any(spec.local for spec in config.regions):
        return None
    return DegradedTier(config.degraded, config.regions, config.models)


def check_degraded(config: EdgeConfig) -> list[str]:
    """What the ``[degraded]`` section names that cannot be, each naming its key."""
    d, problems = config.degraded, []
    local = [spec for spec in config.regions if spec.local]
    if d.model:
        if d.model not in config.models:
            problems.append(f"degraded.model: {d.model!r} is not in models")
        elif not any(d.model in (spec.models or config.models) for spec in local):
            problems.append(f"degraded.model: no region with local = true serves {d.model!r}")
    aliases = {a.name for a in config.aliases}
    for i, rule in enumerate(d.rules):
        key = f"degraded.rules[{i}]"
        unknown = [m for m in rule.models if m not in config.models and m not in aliases]
        if unknown:
            names = ", ".join(map(repr, unknown))
            problems.append(f"{key}.models: {names} is neither in models nor a size alias")
        if rule.traffic is None and rule.substitute is None:
            problems.append(f"{key}: sets neither traffic nor substitute")
    return problems
