"""The control API of a running set of links: read their state, change a profile, inject a fault.

    GET  /health                              200 {"status": "ok", "links": N}
    GET  /links                               {"links": [state, ...]}  (profile, faults, counters)
    GET  /links/{name}                        one link's state
    PUT  /links/{name}   (or POST)            JSON override: {"delay_ms": 80, "jitter_ms": 5,
                                              "rate_kbps": 2000, "loss": {"model": "bernoulli", "p": 0.01},
                                              "direction": "a_to_b" | "b_to_a" | "both", "profile": NAME}
    POST /links/{name}/faults/{fault}         reset | blackhole | slow_close | down | up | clear;
                                              slow_close takes ms from ?ms=500 or {"ms": 500}

Changes apply to open connections from their next chunk on. Errors are OpenAI-shaped, as every
Nearshore service's: an override faster than light is a 400 whose ``param`` names the key.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from nearshore.config import ConfigError
from nearshore.httpkit import openai_errors, read_json, request_ids
from nearshore.protocol.errors import INVALID_REQUEST, NOT_FOUND, ApiError
from netem.link import FAULTS, LinkEmulator, LinkSet
from netem.profiles import LinkOverride, ProfileError

LINKS = web.AppKey("links", LinkSet)


class FaultBody(msgspec.Struct, forbid_unknown_fields=True):
    ms: float = 0.0


_override_decoder = msgspec.json.Decoder(LinkOverride)
_fault_decoder = msgspec.json.Decoder(FaultBody)


def create_control_app(links: LinkSet) -> web.Application:
    app = web.Application(middlewares=[request_ids, openai_errors])
    app[LINKS] = links
    app.router.add_get("/health", _health)
    app.router.add_get("/links", _list)
    app.router.add_get("/links/{name}", _show)
    app.router.add_put("/links/{name}", _change)
    app.router.add_post("/links/{name}", _change)
    app.router.add_post("/links/{name}/faults/{fault}", _fault)
    return app


def _json(value: object) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), content_type="application/json")


def _link(request: web.Request) -> LinkEmulator:
    name = request.match_info["name"]
    link = request.app[LINKS].get(name)
    if link is None:
        raise ApiError(NOT_FOUND, f"no link named {name!r}", param="name")
    return link


async def _health(request: web.Request) -> web.Response:
    return _json({"status": "ok", "links": len(request.app[LINKS].links)})


async def _list(request: web.Request) -> web.Response:
    return _json({"links": request.app[LINKS].state()})


async def _show(request: web.Request) -> web.Response:
    return _json(_link(request).state())


async def _change(request: web.Request) -> web.Response:
    link = _link(request)
    override = await read_json(request, _override_decoder)
    try:
        link.override(override)
    except ProfileError as exc:
        raise ApiError(INVALID_REQUEST, str(exc), param=exc.key) from None
    except ConfigError as exc:  # an unknown or broken profile name
        raise ApiError(INVALID_REQUEST, str(exc), param="profile") from None
    return _json(link.state())


async def _fault(request: web.Request) -> web.Response:
    link = _link(request)
    fault = request.match_info["fault"]
    if fault not in FAULTS:
        known = ", ".join(FAULTS)
        raise ApiError(INVALID_REQUEST, f"unknown fault {fault!r} (one of: {known})", param="fault")
    ms = 0.0
    if "ms" in request.query:
        try:
            ms = float(request.query["ms"])
        except ValueError:
            raise ApiError(INVALID_REQUEST, "ms must be a number", param="ms") from None
    elif request.can_read_body:
        ms = (await read_json(request, _fault_decoder)).ms
    await link.apply_fault(fault, ms)
    return _json(link.state())
