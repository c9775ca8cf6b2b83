"""The tc netem backend: packet-level emulation in network namespaces, where the kernel has sch_netem.

Two namespaces joined by a veth pair; each side's egress carries one direction of the profile (tc only
shapes egress): ``netem`` for delay, jitter and loss, and a ``tbf`` child for the rate. Unlike the
userspace link, netem drops real packets and the endpoints' TCP retransmits them.

This machine's kernel has no sch_netem (tbf and htb exist), so here :func:`tc_netem_available` says no
and :func:`choose_backend` falls back to the userspace link emulator (netem/link.py). The commands are
built by pure functions, so they are tested without a kernel that runs them.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Literal

from netem.profiles import Direction, Profile

log = logging.getLogger("nearshore.tc")

Backend = Literal["userspace", "tc"]
FALLBACK = "using the userspace link emulator"
QUEUE_LIMIT = 100_000  # packets; netem's default of 1000 drops traffic under long delays
KEEP_ORDER_RATE = "10gbit"  # netem keeps packets in order under jitter only when a rate is set
TBF_LATENCY = "100ms"  # the most a packet waits in the rate limiter's queue (its buffer)


def _run(argv: list[str], timeout_s: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


def _said(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stderr or result.stdout).strip().replace("\n", " ") or f"exit status {result.returncode}"


def _module_hint() -> str:
    """What the module tables say (not definitive: a built-in sch_netem shows in none of them)."""
    if Path("/sys/module/sch_netem").exists():
        return "sch_netem is loaded"
    try:
        if any(line.startswith("sch_netem ") for line in Path("/proc/modules").read_text().splitlines()):
            return "sch_netem is loaded"
    except OSError:
        pass
    if shutil.which("modprobe"):
        result = _run(["modprobe", "-n", "sch_netem"])
        return "sch_netem can be loaded" if result.returncode == 0 else "no sch_netem module to load"
    return "sch_netem is not loaded and there is no modprobe to load it"


@functools.cache
def tc_netem_available() -> tuple[bool, str]:
    """Whether tc netem works here, and why not. The definitive check: in a throwaway network namespace,
    make a veth pair and add a netem qdisc to it; the namespace is deleted whatever happens."""
    if sys.platform != "linux":
        return False, f"tc netem needs Linux, this is {sys.platform}; {FALLBACK}"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return False, f"no {' or '.join(missing)} command (iproute2 is not installed); {FALLBACK}"
    if os.geteuid() != 0:
        return False, f"tc netem needs root to create network namespaces ({_module_hint()}); {FALLBACK}"
    ns = f"nearshore-probe-{os.getpid()}-{secrets.token_hex(3)}"
    created = _run(["ip", "netns", "add", ns])
    if created.returncode != 0:
        return False, f"cannot create a network namespace (ip said: {_said(created)}); {FALLBACK}"
    try:
        veth = _run(["ip", "-n", ns, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1"])
        if veth.returncode != 0:
            return False, f"cannot create a veth pair (ip said: {_said(veth)}); {FALLBACK}"
        _run(["ip", "-n", ns, "link", "set", "probe0", "up"])
        netem = _run(["tc", "-n", ns, "qdisc", "add", "dev", "probe0", "root", "netem", "delay", "1ms"])
        if netem.returncode != 0:
            return False, f"the kernel has no sch_netem qdisc (tc said: {_said(netem)}); {FALLBACK}"
        return True, "tc netem works (a netem qdisc was added in a throwaway namespace)"
    finally:
        _run(["ip", "netns", "del", ns])


def choose_backend(preference: str = "auto") -> Backend:
    """``userspace`` always works; ``tc`` and ``auto`` take tc netem where the kernel has it. Asking for
    tc where it is missing prints why and falls back."""
    if preference not in ("auto", "userspace", "tc"):
        raise ValueError(f"unknown backend {preference!r} (auto, userspace or tc)")
    if preference == "userspace":
        return "userspace"
    ok, message = tc_netem_available()
    if ok:
        return "tc"
    if preference == "tc":
        print(f"nearshore: tc backend asked for, but {message}", file=sys.stderr)
    else:
        log.info("link backend: %s", message)
    return "userspace"


def _pct(p: float) -> str:
    return f"{p * 100:g}%"


def netem_args(direction: Direction) -> list[str]:
    """The netem qdisc for one direction. netem's own jitter is uniform unless a distribution is named
    (normal and pareto need iproute2's tables in /usr/lib/tc)."""
    args = ["netem", "delay", f"{direction.delay_ms:g}ms"]
    if direction.jitter_ms > 0:
        args.append(f"{direction.jitter_ms:g}ms")
        if direction.jitter != "uniform":
            args += ["distribution", direction.jitter]
    loss = direction.loss
    if loss.model == "bernoulli":
        args += ["loss", "random", _pct(loss.p)]
    elif loss.model == "gilbert-elliott":
        args += ["loss", "gemodel", _pct(loss.p), _pct(loss.r), _pct(1 - loss.h), _pct(1 - loss.k)]
    if direction.jitter_ms > 0:
        # With a rate set, netem sends each packet no earlier than the one before: jitter, no reordering.
        args += ["rate", KEEP_ORDER_RATE]
    return [*args, "limit", str(QUEUE_LIMIT)]


def tbf_args(direction: Direction) -> list[str]:
    """A token bucket at the direction's rate; its burst holds 10 ms of data (at least two packets,
    and more than the rate per kernel tick, as tbf needs)."""
    burst = max(3000, int(direction.rate_bytes_per_s / 100))
    return ["tbf", "rate", f"{direction.rate_kbps:g}kbit", "burst", str(burst), "latency", TBF_LATENCY]


def shape_commands(ns: str, dev: str, direction: Direction) -> list[list[str]]:
    """Shape one egress: netem at the root, tbf under it when the direction has a rate. ``replace``
    makes the same commands serve to set up and to change a running link."""
    tc = ["tc", "-n", ns, "qdisc"]
    commands = [[*tc, "replace", "dev", dev, "root", "handle", "1:", *netem_args(direction)]]
    if direction.rate_kbps > 0:
        commands.append([*tc, "replace", "dev", dev, "parent", "1:1", "handle", "10:", *tbf_args(direction)])
    return commands


class TcLink:
    """A profile as two namespaces joined by a veth pair: processes run in ``ns_a`` (the client side,
    address ``addr_a``) and ``ns_b`` (the server side, ``addr_b``), e.g. ``ip netns exec ns_b ...``."""

    def __init__(
        self,
        name: str,
        profile: Profile,
        *,
        ns_a: str | None = None,
        ns_b: str | None = None,
        addr_a: str = "10.77.0.1/30",
        addr_b: str = "10.77.0.2/30",
        dev_a: str = "veth-a",
        dev_b: str = "veth-b",
    ) -> None:
        self.name = name
        self.profile = profile
        self.ns_a = ns_a or f"nearshore-{name}-a"
        self.ns_b = ns_b or f"nearshore-{name}-b"
        self.addr_a, self.addr_b = addr_a, addr_b
        self.dev_a, self.dev_b = dev_a, dev_b

    def up_commands(self) -> list[list[str]]:
        a, b = self.ns_a, self.ns_b
        peer = ["peer", "name", self.dev_b, "netns", b]
        return [
            ["ip", "netns", "add", a],
            ["ip", "netns", "add", b],
            ["ip", "link", "add", self.dev_a, "netns", a, "type", "veth", *peer],
            ["ip", "-n", a, "addr", "add", self.addr_a, "dev", self.dev_a],
            ["ip", "-n", b, "addr", "add", self.addr_b, "dev", self.dev_b],
            ["ip", "-n", a, "link", "set", "lo", "up"],
            ["ip", "-n", b, "link", "set", "lo", "up"],
            ["ip", "-n", a, "link", "set", self.dev_a, "up"],
            ["ip", "-n", b, "link", "set", self.dev_b, "up"],
            *self.shape_commands(),
        ]

    def shape_commands(self) -> list[list[str]]:
        """a_to_b leaves through a's end of the pair, b_to_a through b's."""
        return [
            *shape_commands(self.ns_a, self.dev_a, self.profile.a_to_b),
            *shape_commands(self.ns_b, self.dev_b, self.profile.b_to_a),
        ]

    def down_commands(self) -> list[list[str]]:
        return [["ip", "netns", "del", self.ns_a], ["ip", "netns", "del", self.ns_b]]  # takes the veth too

    def up(self) -> None:
        ok, message = tc_netem_available()
        if not ok:
            raise RuntimeError(message)
        try:
            self._run_all(self.up_commands())
        except RuntimeError:
            self.down()
            raise

    def set_profile(self, profile: Profile) -> None:
        old, self.profile = self.profile, profile
        self._run_all(self.shape_commands())
        for ns, dev, before, after in (
            (self.ns_a, self.dev_a, old.a_to_b, profile.a_to_b),
            (self.ns_b, self.dev_b, old.b_to_a, profile.b_to_a),
        ):
            if before.rate_kbps > 0 and after.rate_kbps == 0:
                tbf = ["parent", "1:1", "handle", "10:"]
                self._run_all([["tc", "-n", ns, "qdisc", "del", "dev", dev, *tbf]])

    def down(self) -> None:
        for argv in self.down_commands():
            _run(argv)  # best effort: either namespace may not exist

    @staticmethod
    def _run_all(commands: list[list[str]]) -> None:
        for argv in commands:
            result = _run(argv)
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)}: {_said(result)}")
