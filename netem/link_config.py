"""The links of a topology as data: a ``--link`` spec or a TOML file's entries, built into a LinkSet."""

from __future__ import annotations

from pathlib import Path

import msgspec

from nearshore.config import ConfigError
from netem.link import LinkEmulator, LinkSet, parse_hostport
from netem.profiles import load_profile


class LinkEntry(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    listen: str
    target: str
    profile: str
    reverse: bool = False  # the client sits at the profile's "b"


class LinksConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``nearshore link --config FILE``: the links of a topology in one TOML file."""

    control: str = "127.0.0.1:0"
    seed: int = 0
    handshake: bool = True
    links: list[LinkEntry] = msgspec.field(default_factory=list)


def parse_link_spec(spec: str) -> LinkEntry:
    """``NAME=LISTEN_HOST:PORT->TARGET_HOST:PORT@PROFILE`` (PROFILE: a shipped name or a path)."""
    name, eq, rest = spec.partition("=")
    addresses, at, profile = rest.rpartition("@")
    listen, arrow, target = addresses.partition("->")
    if not (eq and at and arrow and name and profile):
        raise ValueError(f"expected NAME=HOST:PORT->HOST:PORT@PROFILE, got {spec!r}")
    parse_hostport(listen), parse_hostport(target)
    return LinkEntry(name, listen, target, profile)


def build_link_set(
    entries: list[LinkEntry], seed: int, handshake: bool, where: str, config_file: str | None = None
) -> LinkSet:
    """One LinkEmulator per entry, its profile loaded (a relative path is relative to ``config_file``);
    a bad entry is a ConfigError that says ``where``."""
    links = []
    for entry in entries:
        profile = load_profile(_profile_ref(entry.profile, config_file))
        try:
            links.append(
                LinkEmulator(
                    entry.name,
                    entry.listen,
                    entry.target,
                    profile.reversed() if entry.reverse else profile,
                    seed,
                    handshake=handshake,
                )
            )
        except ValueError as exc:
            raise ConfigError(f"{where}: link {entry.name}: {exc}") from None
    try:
        return LinkSet(links)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _profile_ref(profile: str, config_file: str | None) -> str | Path:
    """A relative profile path in a config file is relative to that file."""
    if config_file and ("/" in profile or profile.endswith(".toml")) and not Path(profile).is_absolute():
        return Path(config_file).parent / profile
    return profile
