"""Topologies: validation, `nearshore up` + `nearshore chat` end to end, Ctrl-C leaving no process behind,
and the scenarios on a real topology."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.topology import load_topology, nearest_region
from nearshore.config import ConfigError
from netem.profiles import load_profile

ROOT = Path(__file__).resolve().parents[2]


def test_default_topology_is_lagos_london_virginia_johannesburg_and_a_lagos_local_node():
    t = load_topology("lagos")
    assert (t.user.city, t.edge.city) == ("lagos", "lagos")
    assert [(r.name, r.city, r.link, r.model, r.local) for r in t.regions] == [
        ("london", "london", "lagos-london", "gemma-3-270m", False),
        ("london-small", "london", "lagos-london", "smollm2-135m", False),
        ("virginia", "virginia", "lagos-virginia", "gemma-3-270m", False),
        ("johannesburg", "johannesburg", "lagos-johannesburg", "gemma-3-270m", False),
        ("lagos-local", "lagos", "lagos-metro", "smollm2-135m", True),
    ]
    # At rest the user's requests cross to London, for either model; the local node stands by.
    assert nearest_region(t).name == "london"
    assert nearest_region(t, "smollm2-135m").name == "london-small"


def test_every_profile_of_the_default_topology_is_sourced_and_above_the_floor():
    """Johannesburg included: a real choice for the router, nearer than Virginia, farther than London."""
    t = load_topology("lagos")
    rtts = {}
    for region in t.regions:
        profile = load_profile(region.link)
        assert (profile.a, profile.b) == ("lagos", region.city)
        for text in (profile.source.delay, profile.source.jitter, profile.source.loss, profile.source.rate):
            assert text.startswith(("measured", "estimate")) and len(text) > 20
        assert profile.rtt_ms > 1.5 * profile.floor_rtt_ms
        rtts[region.name] = profile.rtt_ms
    assert rtts["london"] < rtts["johannesburg"] < rtts["virginia"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'name = "x"\n[user]\ncity = "lagos"\nlink = "lagos-mars"\n[edge]\ncity = "lagos"\n'
            '[[regions]]\nname = "london"\ncity = "london"\nlink = "lagos-london"\n',
            "user.link",
        ),
        (
            'name = "x"\n[user]\ncity = "lagos"\nlink = "lagos-4g"\n[edge]\ncity = "lagos"\n'
            '[[regions]]\nname = "london"\ncity = "london"\nlink = "nowhere"\n',
            "regions[0].link",
        ),
        (
            'name = "x"\n[user]\ncity = "lagos"\nlink = "lagos-4g"\n[edge]\ncity = "lagos"\n'
            '[[regions]]\nname = "a"\ncity = "london"\nlink = "lagos-london"\n'
            '[[regions]]\nname = "a"\ncity = "london"\nlink = "lagos-london"\n',
            "regions[1].name",
        ),
        (
            'name = "x"\ncolour = 1\n[user]\ncity = "lagos"\nlink = "lagos-4g"\n[edge]\ncity = "lagos"\n',
            "colour",
        ),
        (  # a link whose profile joins other cities than the ones it stands between
            'name = "x"\n[user]\ncity = "lagos"\nlink = "lagos-4g"\n[edge]\ncity = "lagos"\n'
            '[[regions]]\nname = "london"\ncity = "london"\nlink = "lagos-virginia"\n',
            "regions[0].link: profile 'lagos-virginia' joins lagos and virginia",
        ),
        (
            'name = "x"\n[user]\ncity = "lagos"\nlink = "lagos-4g"\n[edge]\ncity = "lagos"\n'
            '[[regions]]\nname = "mars"\ncity = "olympus"\nlink = "lagos-london"\n',
            "regions[0].city: unknown city 'olympus'",
        ),
        (
            'name = "x"\n[user]\ncity = "lagos"\nlink = "lagos-4g"\n[edge]\ncity = "lagos"\n'
            '[[regions]]\nname = "london"\ncity = "london"\nlink = "lagos-london"\nmodel = "gpt-9"\n',
            "regions[0].model: unknown model 'gpt-9' (known: gemma-3-270m, smollm2-135m)",
        ),
        (  # a local region is on the edge's side of the ocean
            'name = "x"\n[user]\ncity = "lagos"\nlink = "lagos-4g"\n[edge]\ncity = "lagos"\n'
            '[[regions]]\nname = "london"\ncity = "london"\nlink = "lagos-london"\nlocal = true\n',
            "regions[0].local: a local region is in the edge's city (lagos), not london",
        ),
        (
            'name = "x"\n[user]\ncity = "lagos"\nlink = "lagos-4g"\n[edge]\ncity = "lagos"\n'
            '[[regions]]\nname = "here"\ncity = "lagos"\nlink = "lagos-metro"\nlocal = true\n',
            "every region is local",
        ),
    ],
)
def test_bad_topologies_name_the_file_and_key(tmp_path, text, expected):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_topology(str(path))
    assert str(path) in str(error.value) and expected in str(error.value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone in all but name
        return f.read().split()[2] != "Z"


@pytest.mark.slow
def test_up_then_chat_then_ctrl_c_leaves_nothing_behind(tmp_path):
    run_dir = tmp_path / "run"
    up = subprocess.Popen(
        [sys.executable, "-m", "nearshore", "up", "--run-dir", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Started with SIGINT ignored, as a shell without job control starts a background job: Ctrl-C
        # still stops it (this once left `up` and its children running).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        assert up.stdout is not None
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        output = "".join(lines)
        assert "Nearshore is up" in output, output
        assert "API key:" in output and "curl --cacert" in output and "openai.OpenAI" in output
        state = json.loads((run_dir / "state.json").read_text())
        chat = subprocess.run(
            [
                sys.executable,
                "-m",
                "nearshore",
                "chat",
                "Name one market in Lagos.",
                "--max-tokens",
                "12",
                "--state",
                str(run_dir / "state.json"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert chat.returncode == 0, chat.stderr
        assert "served by london" in chat.stdout and "first token after" in chat.stdout
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
    assert up.returncode == 0
    time.sleep(0.5)
    assert not [pid for pid in state["pids"] if _alive(pid)], "orphan processes after Ctrl-C"


@pytest.mark.slow
def test_lagos_ttft_scenario_through_the_edge_tracks_the_floor(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nearshore",
            "scenario",
            "lagos-ttft",
            "--repeats",
            "3",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads((tmp_path / "lagos-ttft.json").read_text())["data"]
    assert (tmp_path / "lagos-ttft.png").stat().st_size > 10_000
    # Timings here are only checked against the emulated links' delays, which no load can shorten (how close
    # the edge comes to the floor is the scenario's report, not a test: a busy CI machine adds its own time).
    last_mile, ocean = data["last_mile_rtt_ms"], data["ocean_rtt_ms"]
    assert data["through_edge_ms"] >= last_mile + ocean, data  # the request crosses both links once
    assert data["direct_ms"] >= 2 * (last_mile + ocean), data  # TLS and the request each cross the ocean
    # A cache hit never crosses the ocean: every repeat was answered from the edge's cache.
    assert data["hits_from_cache"] == data["repeats"] == 3, data
