"""``nearshore link``: run emulated links in this process, from flags or a TOML file, with a control API."""

from __future__ import annotations

import argparse
import asyncio
import json

from nearshore.config import ConfigError, load_config
from nearshore.httpkit import install_uvloop, serve
from netem.control import create_control_app
from netem.link import LinkSet, parse_hostport
from netem.link_config import LinksConfig, build_link_set, parse_link_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="NAME=HOST:PORT->HOST:PORT@PROFILE",
        help="a link: listen on the first address, forward to the second, shaped by PROFILE "
        "(a name in configs/netem/ or a path); repeat for more links; port 0 picks one",
    )
    parser.add_argument("--config", metavar="FILE", help="a TOML file listing links, control and seed")
    parser.add_argument("--control", metavar="HOST:PORT", help="the control API (default 127.0.0.1:0)")
    parser.add_argument("--seed", type=int, help="seed for jitter and loss draws (default 0)")
    parser.add_argument(
        "--no-handshake",
        action="store_true",
        help="let a new connection's first byte go at once (default: it waits one RTT, as TCP's handshake)",
    )


def links_from_args(args: argparse.Namespace) -> tuple[LinkSet, tuple[str, int]]:
    """The file's links, then the flags' (a flag wins over the file for control, seed and handshake)."""
    config = load_config(args.config, LinksConfig) if args.config else LinksConfig()
    where = args.config or "--link"
    entries = list(config.links)
    try:
        entries += [parse_link_spec(spec) for spec in args.link]
        control = parse_hostport(args.control or config.control)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not entries:
        raise ConfigError("nearshore link: no links (give --link or --config)")
    seed = config.seed if args.seed is None else args.seed
    handshake = config.handshake and not args.no_handshake
    return build_link_set(entries, seed, handshake, where, args.config), control


def main(args: argparse.Namespace) -> int:
    links, control = links_from_args(args)
    install_uvloop()
    asyncio.run(_run(links, control))
    return 0


async def _run(links: LinkSet, control: tuple[str, int]) -> None:
    await links.start()
    try:
        await serve(
            create_control_app(links), *control, on_ready=lambda port: _print_ready(links, control[0], port)
        )
    finally:
        await links.stop()


def _print_ready(links: LinkSet, host: str, port: int) -> None:
    """One line per link, then one ``ready {json}`` line a launcher can parse."""
    for link in links.links.values():
        p = link.profile
        print(
            f"link {link.name}: {link.listen} -> {link.target} ({p.name}: RTT {p.rtt_ms:g} ms, "
            f"floor {p.floor_rtt_ms:.1f} ms)",
            flush=True,
        )
    ready = {
        "control": f"http://{host}:{port}",
        "links": {name: {"listen": link.listen, "target": link.target} for name, link in links.links.items()},
    }
    print("ready " + json.dumps(ready), flush=True)
