"""Link profiles: one TOML file per link in ``configs/netem/``, decoded into Structs and checked.

A profile joins two cities ``a`` and ``b`` (the same city for a last-mile or metro link). Each direction
has its own one-way delay, jitter (normal, pareto or uniform), loss model and rate. ``a`` is the side
that connects (the client: a phone, an edge); ``b`` is the side it connects to. Every number says where it
comes from in ``[source]``: "measured: ..." for published measurements, "estimate: ..." for the rest.

Checks beyond the types: both cities are known, and no delay beats light in fibre over the great-circle
distance between them (``netem/geo_floor.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec

from nearshore.config import ConfigError, load_config
from netem import geo_floor

PROFILES_DIR = geo_floor.CONFIGS / "netem"
NOT_PROFILES = {"cities"}  # other data that lives beside the profiles

Ms = Annotated[float, msgspec.Meta(ge=0)]
Probability = Annotated[float, msgspec.Meta(ge=0, le=1)]
Distribution = Literal["normal", "pareto", "uniform"]
LossModel = Literal["none", "bernoulli", "gilbert-elliott"]
Way = Literal["a_to_b", "b_to_a"]
WAYS: tuple[Way, Way] = ("a_to_b", "b_to_a")


class Loss(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Which chunks are "lost". A TCP proxy cannot drop bytes, so a lost chunk arrives ``rto_ms`` late,
    as a retransmission would. Parameters follow tc netem's: ``bernoulli`` loses each chunk with
    probability ``p``; ``gilbert-elliott`` has a good and a bad state, moves good->bad with ``p`` and
    bad->good with ``r``, and lets a chunk through with probability ``h`` in the bad state and ``k`` in the
    good one (so mean loss = p/(p+r)*(1-h) + r/(p+r)*(1-k))."""

    model: LossModel = "none"
    p: Probability = 0.0
    r: Probability = 1.0
    h: Probability = 0.0
    k: Probability = 1.0
    rto_ms: Ms = 200.0  # Linux's minimum retransmission timeout

    @property
    def mean_loss(self) -> float:
        if self.model == "none":
            return 0.0
        if self.model == "bernoulli":
            return self.p
        if self.p + self.r == 0:
            return 1 - self.k
        bad = self.p / (self.p + self.r)
        return bad * (1 - self.h) + (1 - bad) * (1 - self.k)


class Direction(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One direction of a link. Jitter follows tc netem: the standard deviation for ``normal`` and
    ``pareto`` (a shifted pareto: mean 0, long right tail), the half-width for ``uniform``."""

    delay_ms: Ms
    jitter_ms: Ms = 0.0
    jitter: Distribution = "normal"
    loss: Loss = Loss()
    rate_kbps: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # 0 = unlimited

    @property
    def rate_bytes_per_s(self) -> float:
        return self.rate_kbps * 1000 / 8


class Source(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Where each number comes from; each text starts with "measured" or "estimate"."""

    delay: str
    jitter: str
    loss: str
    rate: str


class Profile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    a: str
    b: str
    source: Source
    a_to_b: Direction
    b_to_a: Direction
    description: str = ""

    @property
    def rtt_ms(self) -> float:
        return self.a_to_b.delay_ms + self.b_to_a.delay_ms

    @property
    def floor_rtt_ms(self) -> float:
        return geo_floor.floor_rtt_ms(self.a, self.b)

    def way(self, way: Way) -> Direction:
        return self.a_to_b if way == "a_to_b" else self.b_to_a

    def reversed(self) -> Profile:
        """The same link seen from ``b``: for a client that sits at ``b``."""
        return msgspec.structs.replace(self, a=self.b, b=self.a, a_to_b=self.b_to_a, b_to_a=self.a_to_b)


class ProfileError(ValueError):
    """A profile value that cannot be; ``key`` is its dotted path (``a_to_b.delay_ms``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def check_profile(profile: Profile) -> None:
    """Raise :class:`ProfileError` for unknown cities, unlabelled sources, loss settings that do
    nothing, and delays faster than light."""
    for key in ("a", "b"):
        try:
            geo_floor.city(getattr(profile, key))
        except KeyError as exc:
            raise ProfileError(key, exc.args[0]) from None
    for field in msgspec.structs.fields(Source):
        text = getattr(profile.source, field.name).strip().lower()
        if not text.startswith(("measured", "estimate")):
            raise ProfileError(
                f"source.{field.name}", 'must start with "measured" (published numbers) or "estimate"'
            )
    km = geo_floor.distance_km(profile.a, profile.b)
    floor_ms = geo_floor.floor_one_way_ms(km)
    for way in WAYS:
        direction = profile.way(way)
        if direction.loss.model == "none" and direction.loss.p > 0:
            raise ProfileError(f"{way}.loss.p", 'is set but loss.model is "none"')
        if direction.delay_ms < floor_ms:
            raise ProfileError(
                f"{way}.delay_ms",
                f"{direction.delay_ms:g} ms is faster than light in fibre over {km:,.0f} km "
                f"({floor_ms:.1f} ms one way)",
            )


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (``lagos-london``) or any profile file by path; checked."""
    path = _profile_path(name_or_path)
    shown = _shown(path)
    profile = load_config(shown, Profile)
    try:
        check_profile(profile)
    except ProfileError as exc:
        raise ConfigError(f"{shown}: {exc}") from None
    return profile


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml") if p.stem not in NOT_PROFILES)


def _profile_path(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or text.endswith(".toml"):
        return Path(name_or_path)
    path = PROFILES_DIR / f"{text}.toml"
    if text in NOT_PROFILES or not path.is_file():
        raise ConfigError(f"unknown link profile {text!r} (known: {', '.join(list_profiles())})")
    return path


def _shown(path: Path) -> Path:
    """The path relative to the working directory where it is below it (shorter error messages)."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


class LinkOverride(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A change to a running link (the control API's body): start from ``profile`` if given, then set the
    given fields on ``direction`` ("both" by default). Delays stay one way."""

    direction: Literal["both", "a_to_b", "b_to_a"] = "both"
    profile: str | None = None
    delay_ms: Ms | None = None
    jitter_ms: Ms | None = None
    jitter: Distribution | None = None
    rate_kbps: Annotated[float, msgspec.Meta(ge=0)] | None = None
    loss: Loss | None = None


def apply_override(profile: Profile, override: LinkOverride) -> Profile:
    """The profile with ``override`` applied and checked (:class:`ProfileError` names the key)."""
    base = load_profile(override.profile) if override.profile else profile
    changes = {
        name: value
        for name in ("delay_ms", "jitter_ms", "jitter", "rate_kbps", "loss")
        if (value := getattr(override, name)) is not None
    }
    ways = WAYS if override.direction == "both" else (override.direction,)
    new = msgspec.structs.replace(
        base, **{way: msgspec.structs.replace(base.way(way), **changes) for way in ways}
    )
    check_profile(new)
    return new
