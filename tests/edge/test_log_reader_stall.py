"""An edge whose log reader stops reading keeps serving (a full stderr pipe blocked its event loop, every
user's requests with it: measured, the edge stopped after 127 requests with JSON request logs), and the
lines it queued meanwhile reach the log once it is read."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from harness.procs import ManagedProcess
from nearshore.children import nearshore_argv
from tests.edge_fixtures import edge_over_pacer

pytestmark = pytest.mark.slow

PIPE_BYTES = 64 * 1024  # Linux's default pipe capacity
REQUESTS = 400  # their JSON request lines fill the pipe more than twice over


def test_an_edge_whose_stderr_nobody_reads_keeps_serving(tmp_path: Path):
    sections = {"tls": {"enabled": False}, "logging": {"format": "json"}}
    edge = edge_over_pacer(tmp_path, "pacer", sections, tokens=2, interval_ms=0)
    key = edge.new_key(rpm=10**6, tpm=10**9)
    edge.process.stop()  # the same edge again, its stderr a pipe that nothing reads
    process = ManagedProcess("edge", [], tmp_path / "unused.log")
    process.proc = subprocess.Popen(
        nearshore_argv("edge", "--config", str(edge.folder / "edge.toml")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        process.wait_http(edge.url + "/health")
        body = json.dumps(
            {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ).encode()
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        for _ in range(REQUESTS):  # a blocked loop fails this with a timeout
            request = urllib.request.Request(edge.url + "/v1/chat/completions", body, headers)
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
        process.proc.terminate()  # at exit the edge writes what it queued
        _, log = process.proc.communicate(timeout=60)
    finally:
        if process.proc.poll() is None:
            process.proc.kill()
        for extra in edge.extra:
            extra.stop()
    assert len(log) > PIPE_BYTES
    lines = [json.loads(line) for line in log.splitlines() if line.startswith(b"{")]
    served = [line for line in lines if line.get("status") == 200 and line.get("request_id")]
    assert len(served) == REQUESTS  # every request's line, none dropped: the queue held them
