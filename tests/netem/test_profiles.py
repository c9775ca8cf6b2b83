"""Link profiles: every shipped one loads and respects light; each bad input names the file and key."""

from __future__ import annotations

import pytest

from nearshore.config import ConfigError
from netem import geo_floor
from netem.profiles import (
    LinkOverride,
    Loss,
    ProfileError,
    apply_override,
    list_profiles,
    load_profile,
)

REQUIRED = {
    "lagos-4g",
    "lagos-london",
    "lagos-frankfurt",
    "lagos-virginia",
    "lagos-johannesburg",
    "london-virginia",
    "lagos-metro",
}

GOOD = """\
name = "x"
a = "lagos"
b = "london"

[source]
delay = "estimate: test"
jitter = "estimate: test"
loss = "estimate: test"
rate = "estimate: test"

[a_to_b]
delay_ms = 50.0
jitter_ms = 2.0
jitter = "normal"
loss = { model = "bernoulli", p = 0.01 }

[b_to_a]
delay_ms = 50.0
"""


def test_cities_are_known():
    for name in ("lagos", "london", "frankfurt", "paris", "dublin", "virginia", "johannesburg", "cape-town"):
        geo_floor.city(name)
    with pytest.raises(KeyError, match="unknown city 'atlantis'"):
        geo_floor.city("atlantis")


@pytest.mark.parametrize(
    ("a", "b", "floor_ms"),
    # The great-circle floors of the latency notes.
    [("lagos", "london", 50), ("lagos", "virginia", 88), ("london", "virginia", 59), ("lagos", "lagos", 0)],
)
def test_floor_rtt_matches_the_notes(a, b, floor_ms):
    assert geo_floor.floor_rtt_ms(a, b) == pytest.approx(floor_ms, abs=1.5)


def test_every_shipped_profile_loads_and_beats_no_light():
    names = list_profiles()
    assert set(names) >= REQUIRED and "cities" not in names
    for name in names:
        profile = load_profile(name)
        assert profile.name == name
        for way in ("a_to_b", "b_to_a"):
            assert profile.way(way).delay_ms * 2 >= profile.floor_rtt_ms
        for text in (profile.source.delay, profile.source.jitter, profile.source.loss, profile.source.rate):
            assert text.startswith(("measured", "estimate"))


def test_shipped_numbers_follow_the_notes():
    assert 20 <= load_profile("lagos-4g").rtt_ms <= 55
    assert 90 <= load_profile("lagos-london").rtt_ms <= 110
    assert load_profile("london-virginia").rtt_ms == pytest.approx(75.5, abs=0.5)
    assert load_profile("london-virginia").source.delay.startswith("measured")
    assert load_profile("lagos-london").source.delay.startswith("estimate")
    assert load_profile("lagos-metro").rtt_ms <= 1.5


def test_a_path_loads_too(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(GOOD)
    profile = load_profile(str(path))
    assert profile.rtt_ms == 100 and profile.a_to_b.loss.p == 0.01 and profile.b_to_a.jitter_ms == 0


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "[a_to_b]\ndelay_ms = 50.0",
            "[a_to_b]\ndelay_ms = 10.0",
            "a_to_b.delay_ms: 10 ms is faster than light in fibre over 5,020 km (25.1 ms one way)",
        ),
        ("[b_to_a]\ndelay_ms = 50.0", "[b_to_a]\ndelay_ms = -1.0", "b_to_a.delay_ms: Expected `float` >= 0"),
        ('jitter = "normal"', 'jitter = "gauss"', "a_to_b.jitter: Invalid enum value 'gauss'"),
        ('model = "bernoulli"', 'model = "markov"', "a_to_b.loss.model: Invalid enum value 'markov'"),
        ("p = 0.01", "p = 1.5", "a_to_b.loss.p: Expected `float` <= 1"),
        ('b = "london"', 'b = "atlantis"', "b: unknown city 'atlantis'"),
        ("jitter_ms = 2.0", "jitter_ms = 2.0\ncolour = 1", "a_to_b.colour: unknown key"),
        ('rate = "estimate: test"', 'rate = "a guess"', "source.rate: must start with"),
        ('model = "bernoulli"', 'model = "none"', 'a_to_b.loss.p: is set but loss.model is "none"'),
    ],
)
def test_bad_profiles_name_the_file_and_key(tmp_path, old, new, expected):
    assert old in GOOD
    path = tmp_path / "x.toml"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as error:
        load_profile(path)
    assert str(error.value).startswith(f"{path}: ") and expected in str(error.value)


def test_unknown_profile_name():
    with pytest.raises(ConfigError, match=r"unknown link profile 'atlantis' \(known: .*lagos-london"):
        load_profile("atlantis")


def test_override_changes_one_direction_and_checks_light():
    profile = load_profile("lagos-london")
    new = apply_override(profile, LinkOverride(direction="b_to_a", delay_ms=70, rate_kbps=1000))
    assert (new.a_to_b, new.b_to_a.delay_ms, new.b_to_a.rate_kbps) == (profile.a_to_b, 70, 1000)
    lossy = apply_override(profile, LinkOverride(loss=Loss("gilbert-elliott", p=0.01, r=0.5)))
    assert lossy.a_to_b.loss.model == lossy.b_to_a.loss.model == "gilbert-elliott"
    with pytest.raises(ProfileError) as error:
        apply_override(profile, LinkOverride(delay_ms=5))
    assert error.value.key == "a_to_b.delay_ms" and "faster than light" in str(error.value)


def test_reversed_profile_swaps_ends():
    profile = load_profile("lagos-4g")
    back = profile.reversed()
    assert back.a_to_b == profile.b_to_a and back.b_to_a == profile.a_to_b and back.reversed() == profile


def test_mean_loss_of_the_models():
    assert Loss().mean_loss == 0
    assert Loss("bernoulli", p=0.2).mean_loss == 0.2
    assert Loss("gilbert-elliott", p=0.05, r=0.2).mean_loss == pytest.approx(0.2)
