"""One request on a brand-new connection, timed phase by phase: TCP handshake, TLS handshake, first token.

A hand-rolled HTTP/1.1 exchange over asyncio streams, so nothing (pooling, DNS, retries) hides a phase.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_FIRST_TOKEN = re.compile(rb'"content":"[^"]')


@dataclass
class Phases:
    tcp_s: float = 0.0
    tls_s: float = 0.0
    first_token_s: float = 0.0  # from the request's last byte sent to the first token's arrival
    status: int = 0
    region: str = ""
    server_timing: dict[str, float] = field(default_factory=dict)  # milliseconds, by name

    @property
    def ttft_s(self) -> float:
        return self.tcp_s + self.tls_s + self.first_token_s


def parse_server_timing(header: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";")
        if "dur=" in rest:
            try:
                out[name] = float(rest.split("dur=")[1].split(";")[0])
            except ValueError:
                continue
    return out


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
            raw_head = await reader.readuntil(b"\r\n\r\n")
            lines = raw_head.decode(errors="replace").split("\r\n")
            phases.status = int(lines[0].split()[1])
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.lower() == "server-timing":
                    phases.server_timing.update(parse_server_timing(value))
                elif name.lower() == "x-nearshore-region":
                    phases.region = value.strip()
            seen = b""
            while phases.status == 200:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                seen += chunk
                if not phases.first_token_s and _FIRST_TOKEN.search(seen):
                    phases.first_token_s = time.perf_counter() - sent
                if b"data: [DONE]" in seen:
                    break  # read to the end, as a user would: leaving early would abort the stream
        finally:
            writer.close()
    return phases
