"""The load generator's own ceiling: how many requests and tokens per second one ``bench load`` process
sustains against a server that costs nothing (every answer ready at once).

The zero-latency SSE server runs in a child process the generator starts (``python -m
bench.load.selftest --port N``), so that its work does not come out of the client's event loop; the
client side is the very code path of a real run (the same session, sender and statistics). Anything a run
measures near this ceiling measures the client, not the server.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aiohttp import web

from harness.procs import ManagedProcess, free_port
from nearshore.protocol import sse
from nearshore.protocol.answers import ChatAnswer
from nearshore.protocol.schemas import Usage

TOKENS = 16


def _answer(tokens: int) -> bytes:
    """The whole SSE body, built once: a role event, ``tokens`` content events, usage, [DONE]."""
    answer = ChatAnswer("self", "self-test")
    token = sse.event(answer.content(" tok"))
    usage = sse.event(answer.usage(Usage.of(10, tokens)))
    return sse.event(answer.opener()) + token * tokens + usage + sse.DONE


def create_app(tokens: int) -> web.Application:
    body = _answer(tokens)

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(body)
        await response.write_eof()
        return response

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    return app


def start_server(log_path: Path, tokens: int = TOKENS) -> tuple[str, ManagedProcess]:
    """The zero-latency server in its own process, ready: its base URL and the process (stop it)."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.load.selftest", "--port", str(port), "--tokens", str(tokens)]
    process = ManagedProcess("load-selftest", argv, log_path).start()
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_http(url + "/health", timeout_s=30)
    except BaseException:
        process.stop()
        raise
    return url, process


def main() -> None:
    parser = argparse.ArgumentParser(description="a zero-latency SSE server for bench load's self-test")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=TOKENS)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(create_app(args.tokens), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
