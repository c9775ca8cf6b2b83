"""The degraded tier's policy (``[degraded]``), with no I/O: by key tier and model, local traffic shared or
standby, and whether the local stand-in may answer for a model no local region serves; its config checks."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from edge.config import DegradedConfig, EdgeConfig
from edge.degraded_policy import DegradedTier, check_degraded, default_stand_in, make_degraded
from geo.catalog import RegionSpec

SMALL, LARGE, TINY = "smollm2-135m", "gemma-3-270m", "phi-mini"
MODELS = [SMALL, LARGE, TINY]
REGIONS = [
    RegionSpec(name="london", url="http://127.0.0.1:9001", models=[LARGE]),
    RegionSpec(name="frankfurt", url="http://127.0.0.1:9002", models=[SMALL, TINY], pool="small"),
    RegionSpec(name="lagos", url="http://127.0.0.1:9003", models=[SMALL], pool="small", local=True),
]


def tier(**config: object) -> DegradedTier:
    return DegradedTier(msgspec.convert(config, DegradedConfig), REGIONS, MODELS)


def test_by_default_the_stand_in_answers_an_alias_and_the_small_pool_never_a_model_named_explicitly():
    t = tier()
    assert t.stand_in == SMALL
    assert t.policy("default", LARGE, alias="auto").stand_in == SMALL  # `auto` accepts either size
    assert t.policy("default", TINY).stand_in == SMALL  # a small-pool model: the small model stands in
    assert t.policy("default", LARGE).stand_in == ""  # named explicitly: a 503, not a silent substitute
    assert t.policy("default", SMALL).stand_in == ""  # served on this side itself: no stand-in needed
    assert not t.policy("default", SMALL).share_local


def test_rules_by_tier_and_model_win_over_the_section_first_match_first():
    t = tier(
        rules=[
            {"tiers": ["premium"], "models": [LARGE], "substitute": "always"},
            {"tiers": ["free"], "substitute": "never"},
            {"tiers": ["batch", "free"], "traffic": "share"},
            {"traffic": "standby", "substitute": "always"},
        ]
    )
    assert t.policy("premium", LARGE).stand_in == SMALL
    assert t.policy("free", LARGE, alias="auto").stand_in == ""  # never, even for `auto`
    assert t.policy("free", SMALL).share_local and t.policy("batch", SMALL).share_local
    assert not t.policy("default", SMALL).share_local
    assert t.policy("default", LARGE).stand_in == SMALL  # the catch-all rule
    everyone = tier(substitute="always", traffic="share")
    assert everyone.policy("x", LARGE).stand_in == SMALL and everyone.policy("x", LARGE).share_local
    assert tier(substitute="never").policy("x", TINY).stand_in == ""
    # A rule may name the size alias the request asked for.
    aliased = tier(substitute="never", rules=[{"models": ["auto"], "substitute": "sized"}])
    assert aliased.policy("x", LARGE, alias="auto").stand_in == SMALL


def test_the_stand_in_is_the_local_small_pools_first_model_unless_named():
    large_first = [
        RegionSpec(name="a", url="http://a:1", models=[LARGE], local=True),
        RegionSpec(name="b", url="http://b:1", models=[TINY, SMALL], pool="small", local=True),
    ]
    assert default_stand_in(large_first, MODELS) == TINY
    assert default_stand_in([], MODELS) == ""
    assert DegradedTier(DegradedConfig(model=SMALL), large_first, MODELS).stand_in == SMALL


def config(**fields: object) -> EdgeConfig:
    base: dict[str, object] = {
        "models": MODELS,
        "regions": [msgspec.to_builtins(r) for r in REGIONS],
        "aliases": [{"name": "auto", "small": SMALL, "large": LARGE}],
    }
    return msgspec.convert({**base, **fields}, EdgeConfig)


def test_config_mistakes_are_one_line_each_naming_the_key():
    assert check_degraded(config()) == []
    assert check_degraded(config(degraded={"model": "gpt-9"})) == ["degraded.model: 'gpt-9' is not in models"]
    assert check_degraded(config(degraded={"model": TINY})) == [
        f"degraded.model: no region with local = true serves {TINY!r}"
    ]
    bad = {"rules": [{"models": ["gpt-9", "auto"], "substitute": "always"}, {"tiers": ["free"]}]}
    assert check_degraded(config(degraded=bad)) == [
        "degraded.rules[0].models: 'gpt-9' is neither in models nor a size alias",
        "degraded.rules[1]: sets neither traffic nor substitute",
    ]
    assert make_degraded(config()) is not None
    remote_only = config(regions=[msgspec.to_builtins(r) for r in REGIONS[:2]])
    assert make_degraded(remote_only) is None  # no local region: nothing to degrade to


def test_a_bad_value_names_its_key():
    try:
        msgspec.convert({"degraded": {"traffic": "sometimes"}}, EdgeConfig)
    except msgspec.ValidationError as exc:
        assert "$.degraded.traffic" in str(exc)
    else:
        raise AssertionError("a bad traffic value was accepted")


def test_the_edge_configs_degraded_section_documents_every_setting_at_its_default():
    root = Path(__file__).resolve().parents[2]
    section = tomllib.loads((root / "configs" / "edge.toml").read_text())["degraded"]
    defaults = msgspec.structs.asdict(DegradedConfig())
    assert set(section) == set(defaults), set(section) ^ set(defaults)
    assert msgspec.convert(section, DegradedConfig) == DegradedConfig()
