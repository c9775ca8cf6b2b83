"""No secret reaches a log line: the redactor, the formatter the CLI installs, and a real edge fed requests
that are malformed at the HTTP level (aiohttp logs their raw line) with a real key in them."""

from __future__ import annotations

import io
import logging
import socket
import time
from pathlib import Path

import pytest

from nearshore import logsafe
from tests.edge_fixtures import edge_over_pacer

KEY = "ns-9eb35b7111b3-qWExrUpQJe1wmFwwOBc8oUxypsIEFob3ZOODXUH9_EY"
KEY_ID, SECRET = "ns-9eb35b7111b3-", KEY[16:]


@pytest.mark.parametrize(
    "text, expected",
    [
        (f"b'Authorization: Bearer {KEY}\\x00'", f"b'Authorization: Bearer {KEY_ID}***'"),
        (f"b'Authorization: Bearer {KEY}\\rX: y'", f"b'Authorization: Bearer {KEY_ID}*** y'"),
        (f"reading: b'Bearer {KEY}AAAA...'.", f"reading: b'Bearer {KEY_ID}***'."),
        (f"b'POST /v1/x?\\x01{KEY} HTTP/1.1'", f"b'POST /v1/x?\\x01{KEY_ID}*** HTTP/1.1'"),
        (f"b'GET /\\xff{KEY} HTTP/1.1'", f"b'GET /\\xff{KEY_ID}*** HTTP/1.1'"),
        (f"cut short: {KEY[:30]}", f"cut short: {KEY_ID}***"),
        (f"{KEY[:20]}\\x00{KEY[20:]}", f"{KEY_ID}***"),  # a bad byte inside the key hides nothing
        ("x-api-key: sk-other-vendor", "x-api-key: ***"),
        (
            "{'X-Api-Key': 'sk-abc', 'x-nearshore-edge-secret': 'hunter2'}",
            "{'X-Api-Key': '***', 'x-nearshore-edge-secret': '***'}",
        ),
        ("AUTHORIZATION: Basic dXNlcjpwYXNz", "AUTHORIZATION: Basic ***"),
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("key ns-9eb35b7111b3 has no secret; ns- alone; nothing else", None),
        ("2026-11-30 INFO nearshore.edge: edge lagos serving on https://127.0.0.1:8443", None),
    ],
)
def test_redact(text: str, expected: str | None):
    assert logsafe.redact(text) == (text if expected is None else expected)


def test_registered_secrets_are_masked_as_written_and_as_escaped():
    secret = "correct horse ✓ 'battery'"
    logsafe.register_secret(secret)
    logsafe.register_secret("")  # ignored, not "mask everything"
    assert logsafe.redact(f"a {secret} b") == "a *** b"
    assert logsafe.redact(f"a {secret!r} b") == 'a "***" b'
    assert logsafe.redact(f"a {secret.encode()!r} b") == 'a b"***" b'
    assert logsafe.redact("nothing here") == "nothing here"


def test_the_installed_formatter_redacts_messages_arguments_and_tracebacks():
    logger = logging.getLogger("test.logsafe")
    logger.propagate = False
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    try:
        logsafe.install(logger)
        logsafe.install(logger)  # twice: wrapped once
        logger.error("in the message %s", KEY)
        logger.error("in an argument: %r", {"Authorization": f"Bearer {KEY}"})
        try:
            raise ValueError(f"Invalid header value char: b'x-api-key: {KEY}\\x00'")
        except ValueError:
            logger.exception("in a traceback")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert SECRET not in text
    assert text.startswith(f"ERROR in the message {KEY_ID}***\n")  # the inner format is kept
    assert text.count(KEY_ID) == 3 and "ValueError" in text


@pytest.mark.slow
def test_malformed_requests_leave_no_secret_in_the_edge_logs(tmp_path: Path):
    shared_secret = "edge-to-region-" + "s3cr3t" * 4
    edge = edge_over_pacer(
        tmp_path, "redact-pacer", {"upstream": {"shared_secret": shared_secret}}, tokens=1, interval_ms=1
    )
    key = edge.new_key()
    secret = key[16:]
    host, port = "127.0.0.1", int(edge.url.rsplit(":", 1)[1])
    context = edge.ssl_context()
    bearer = f"Authorization: Bearer {key}".encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    malformed = [
        head + bearer + b"\x00\r\n\r\n",  # a NUL after the key
        head + bearer + b"\rX-Next: 1\r\n\r\n",  # a bare CR after the key
        head + bearer + b"A" * 9000 + b"\r\n\r\n",  # an over-long header line
        head + f"x-api-key: {key}\x01\r\n\r\n".encode(),
        f"GET /v1/models?key=\x01{key} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),  # a bad byte in the URL
        b"GET /v1/\xff" + key.encode() + b" HTTP/1.1\r\nHost: x\r\n" + bearer + b"\r\n\r\n",
        f"GET /?\x01{shared_secret} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),  # only register_secret knows this
        head + f"x-nearshore-edge-secret: {shared_secret}\x00\r\n\r\n".encode(),
    ]
    try:
        for raw in malformed:
            with (
                socket.create_connection((host, port)) as plain,
                context.wrap_socket(plain, server_hostname="localhost") as tls,
            ):
                tls.sendall(raw)
                tls.settimeout(5)
                assert tls.recv(100).split(b" ")[1] == b"400"
        time.sleep(0.5)  # let the edge write its log lines
    finally:
        edge.stop()
    logs = {p: p.read_text(errors="replace") for p in tmp_path.rglob("*.log")}
    assert logs
    edge_log = logs[tmp_path / "edge" / "edge.log"]
    # Each one line (rate limited), quoting none of the client's bytes, and no traceback.
    assert edge_log.count("malformed HTTP request from 127.0.0.1") >= min(5, len(malformed))
    assert "Traceback" not in edge_log
    for path, text in logs.items():
        assert secret not in text, path
        assert shared_secret not in text, path
        assert key[:30] not in text, path  # not even the start of the secret
