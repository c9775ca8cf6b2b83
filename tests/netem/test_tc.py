"""The tc netem backend: it detects a kernel without sch_netem and says why, and the commands it would run."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from netem.profiles import Direction, Loss, load_profile
from netem.tc import TcLink, choose_backend, netem_args, tbf_args, tc_netem_available

now = time.monotonic


# -- tc backend


def test_tc_detection_says_why_not():
    ok, message = tc_netem_available()
    if ok:
        pytest.skip("this kernel has sch_netem")
    assert message.endswith("; using the userspace link emulator")
    if os.geteuid() == 0 and shutil.which("tc") and shutil.which("ip"):
        assert message.startswith("the kernel has no sch_netem qdisc (tc said: ")
        probes = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "nearshore-probe" not in probes  # the throwaway namespace is gone


def test_choose_backend(capsys):
    assert choose_backend("userspace") == "userspace"
    with pytest.raises(ValueError):
        choose_backend("carrier-pigeon")
    ok, message = tc_netem_available()
    assert choose_backend("tc") == ("tc" if ok else "userspace")
    if not ok:
        assert message in capsys.readouterr().err


def test_tc_commands_for_a_profile():
    profile = load_profile("lagos-4g")
    link = TcLink("l4g", profile)
    commands = [" ".join(argv) for argv in link.up_commands()]
    assert commands[:3] == [
        "ip netns add nearshore-l4g-a",
        "ip netns add nearshore-l4g-b",
        "ip link add veth-a netns nearshore-l4g-a type veth peer name veth-b netns nearshore-l4g-b",
    ]
    assert commands[-4:] == [
        "tc -n nearshore-l4g-a qdisc replace dev veth-a root handle 1: netem delay 20ms 7.5ms "
        "distribution pareto loss random 0.2% rate 10gbit limit 100000",
        "tc -n nearshore-l4g-a qdisc replace dev veth-a parent 1:1 handle 10: tbf rate 8000kbit burst 10000 "
        "latency 100ms",
        "tc -n nearshore-l4g-b qdisc replace dev veth-b root handle 1: netem delay 20ms 7.5ms "
        "distribution pareto loss random 0.2% rate 10gbit limit 100000",
        "tc -n nearshore-l4g-b qdisc replace dev veth-b parent 1:1 handle 10: tbf rate 20000kbit burst 25000 "
        "latency 100ms",
    ]
    assert link.down_commands() == [
        ["ip", "netns", "del", "nearshore-l4g-a"],
        ["ip", "netns", "del", "nearshore-l4g-b"],
    ]


def test_netem_arguments():
    plain = Direction(50.0)
    assert netem_args(plain) == ["netem", "delay", "50ms", "limit", "100000"]
    ge = Direction(10.0, 2.0, "uniform", Loss("gilbert-elliott", p=0.01, r=0.25, h=0.1, k=1.0))
    assert " ".join(netem_args(ge)) == (
        "netem delay 10ms 2ms loss gemodel 1% 25% 90% 0% rate 10gbit limit 100000"
    )
    assert tbf_args(Direction(1.0, rate_kbps=1000)) == [
        "tbf",
        "rate",
        "1000kbit",
        "burst",
        "3000",
        "latency",
        "100ms",
    ]
