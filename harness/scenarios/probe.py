"""One request on a brand-new connection, timed phase by phase: TCP handshake, TLS handshake, first token.

A hand-rolled HTTP/1.1 exchange over asyncio streams, so nothing (pooling, DNS, retries) hides a phase;
the answer's head and its token stream are read by the benchmarks' own client (harness/client.py).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from multidict import CIMultiDict

from harness.client import Stream, read_events, read_head


@dataclass
class Phases:
    tcp_s: float = 0.0
    tls_s: float = 0.0
    stream: Stream = field(default_factory=Stream)  # timed from the request's last byte sent

    @property
    def first_token_s(self) -> float:
        return self.stream.ttft_s

    @property
    def ttft_s(self) -> float:
        return self.tcp_s + self.tls_s + self.first_token_s

    @property
    def status(self) -> int:
        return self.stream.status

    @property
    def server_timing(self) -> dict[str, float]:
        """Milliseconds, by name."""
        return self.stream.server_timing_ms


async def _body(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[bytes]:
    """The response body as it arrives, its chunked framing taken off."""
    if not chunked:
        while data := await reader.read(65536):
            yield data
        return
    while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
        yield await reader.readexactly(size)
        await reader.readexactly(2)  # the CRLF after each chunk


async def probe(
    url: str,
    path: str,
    payload: dict,
    headers: dict[str, str],
    context: ssl.SSLContext,
    timeout_s: float = 60.0,
) -> Phases:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 443
    body = json.dumps(payload).encode()
    phases = Phases()
    async with asyncio.timeout(timeout_s):
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection(host, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connected = time.perf_counter()
        await writer.start_tls(context, server_hostname=host)
        secured = time.perf_counter()
        phases.tcp_s, phases.tls_s = connected - started, secured - connected
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n".encode()
            + body
        )
        await writer.drain()
        sent = time.perf_counter()
        try:
            lines = (await reader.readuntil(b"\r\n\r\n")).decode(errors="replace").split("\r\n")
            answer = CIMultiDict(
                (k.strip(), v.strip()) for k, _, v in (x.partition(":") for x in lines[1:] if x)
            )
            read_head(phases.stream, int(lines[0].split()[1]), answer)
            if phases.status == 200:
                # Read to [DONE], as a user would: leaving early would abort the stream.
                chunked = "chunked" in answer.get("Transfer-Encoding", "").lower()
                await read_events(_body(reader, chunked), phases.stream, sent)
        finally:
            writer.close()
    return phases
