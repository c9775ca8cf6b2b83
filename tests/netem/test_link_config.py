"""Links as data and as a command: a ``--link`` spec, a TOML file's entries, ``nearshore link`` serving."""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import time

import pytest

from cli.link import links_from_args
from nearshore.config import ConfigError
from netem.link_config import parse_link_spec
from tests.netem.test_link import echo, ping_pongs, server

now = time.monotonic


# -- the command


def test_link_spec():
    entry = parse_link_spec("edge=127.0.0.1:0->[::1]:8200@lagos-london")
    assert (entry.name, entry.listen, entry.target, entry.profile) == (
        "edge",
        "127.0.0.1:0",
        "[::1]:8200",
        "lagos-london",
    )
    with pytest.raises(ValueError, match="NAME=HOST:PORT->HOST:PORT@PROFILE"):
        parse_link_spec("edge=127.0.0.1:0@lagos-london")


def test_links_from_a_config_file(tmp_path):
    config = tmp_path / "links.toml"
    config.write_text(
        'control = "127.0.0.1:9901"\nseed = 7\n'
        '[[links]]\nname = "up"\nlisten = "127.0.0.1:0"\ntarget = "127.0.0.1:8200"\n'
        'profile = "lagos-london"\n'
        '[[links]]\nname = "down"\nlisten = "127.0.0.1:0"\ntarget = "127.0.0.1:8201"\n'
        'profile = "lagos-london"\nreverse = true\n'
    )
    args = argparse.Namespace(config=str(config), link=[], control=None, seed=None, no_handshake=False)
    links, control = links_from_args(args)
    assert control == ("127.0.0.1", 9901) and list(links.links) == ["up", "down"]
    assert links.links["down"].profile.a == "london" and links.links["up"].profile.a == "lagos"
    config.write_text(config.read_text().replace('"lagos-london"\nreverse', '"atlantis"\nreverse'))
    with pytest.raises(ConfigError, match="unknown link profile 'atlantis'"):
        links_from_args(args)


async def test_link_command_prints_ready_and_serves():
    async with server(echo) as port:
        code = (
            "import argparse, sys; from cli.link import add_arguments, main; "
            "p = argparse.ArgumentParser(); add_arguments(p); sys.exit(main(p.parse_args()))"
        )
        argv = [sys.executable, "-c", code, "--link", f"metro=127.0.0.1:0->127.0.0.1:{port}@lagos-metro"]
        process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()  # type: ignore[union-attr]
            assert line.startswith("link metro: 127.0.0.1:") and "RTT 1 ms" in line
            ready = (await asyncio.wait_for(process.stdout.readline(), 10)).decode()  # type: ignore[union-attr]
            assert ready.startswith("ready {") and '"control": "http://127.0.0.1:' in ready
            link_port = int(line.split()[2].rsplit(":", 1)[1])
            assert len(await ping_pongs(link_port, 3)) == 3
        finally:
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 10) == 0
