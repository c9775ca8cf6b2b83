"""Nodes with their own settings: admission control, lazy load and idle unload, config errors."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import aiohttp
import pytest

from tests.conftest import MODEL, start_region

pytestmark = pytest.mark.slow


async def test_full_queue_gets_503_with_retry_after(tmp_path):
    node = start_region(
        tmp_path,
        engine={"max_sequences": 1, "max_waiting": 1, "kv_cache_tokens": 2048, "context_window": 1024},
    )
    try:
        payload = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 60,
            "temperature": 0,
        }

        async def one(s: aiohttp.ClientSession) -> tuple[int, str | None]:
            async with s.post(node.url + "/v1/chat/completions", json=payload) as r:
                body = await r.json()
                return r.status, r.headers.get("Retry-After") if r.status == 503 else body["error"][
                    "code"
                ] if "error" in body else None

        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(one(s) for _ in range(5)))
            statuses = sorted(r[0] for r in results)
            assert statuses.count(200) >= 2 and 503 in statuses, results
            assert all(int(r[1]) >= 1 for r in results if r[0] == 503)
            async with s.post(node.url + "/v1/chat/completions", json={**payload, "max_tokens": 2}) as r:
                assert r.status == 200  # served again once the queue drained
    finally:
        node.process.stop()


async def test_lazy_load_then_idle_unload_and_reload(tmp_path):
    node = start_region(
        tmp_path,
        ready_path="/health",
        engine={"load": "lazy", "idle_unload_s": 1.0, "kv_cache_tokens": 2048, "context_window": 1024},
    )
    try:
        async with aiohttp.ClientSession() as s:

            async def state() -> str:
                async with s.get(node.url + "/health") as r:
                    return (await r.json())["model"]

            assert await state() == "unloaded"
            payload = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
            async with s.post(node.url + "/v1/chat/completions", json=payload) as r:
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 3
            assert await state() == "ready"
            deadline = time.monotonic() + 10
            while await state() != "unloaded" and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert await state() == "unloaded"
            async with s.post(node.url + "/v1/chat/completions", json=payload) as r:
                assert r.status == 200  # reloaded on demand
            async with s.get(node.url + "/metrics") as r:
                text = await r.text()
            load_line = next(
                line for line in text.splitlines() if line.startswith("nearshore:model_load_time_seconds")
            )
            assert float(load_line.rsplit(" ", 1)[1]) > 0
    finally:
        node.process.stop()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nearshore", *args], capture_output=True, text=True, timeout=60
    )


def test_config_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[engine]\nmax_sequences = "many"\n')
    result = run_cli("region", "--config", str(bad))
    assert result.returncode == 2
    assert str(bad) in result.stderr and "engine.max_sequences" in result.stderr
    bad.write_text("[engine]\ncolour = 1\n")
    result = run_cli("region", "--config", str(bad))
    assert result.returncode == 2 and "engine.colour: unknown key" in result.stderr
    bad.write_text("[engine]\ncontext_window = 9000\nkv_cache_tokens = 4096\n")
    result = run_cli("region", "--config", str(bad))
    assert result.returncode == 2 and "engine.context_window" in result.stderr
    result = run_cli("region", "--config", str(tmp_path / "missing.toml"))
    assert result.returncode == 2 and "missing.toml" in result.stderr


def test_help_explains_each_command():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("region", "demo", "bench"):
        assert command in result.stdout
