"""``nearshore bench fairness``: one key's flood against another key's short chat, through a real edge
over a real region (llama.cpp, the embedded model, its default engine settings), issue 18 item 6.

The victim key sends short streamed chats one after another; its time to first token (at the client) is
measured alone (unloaded), then while the flood key keeps ``--flood`` requests in flight at once: long prompts
of about ``--flood-tokens`` tokens, or (``--echo``) completions with ``echo`` and ``logprobs=20``, or
(``--embeddings``) embeddings of ``--flood-inputs`` short texts each (issue 34, N16), each worker
sending its next as soon as one ends (and waiting out a 429's Retry-After). Printed: the victim's TTFT p50/p95
both ways, their ratio (target: loaded p50 within 2x of unloaded), what the flood got done, and its prefill
rate (the region's prompt tokens computed a second) alone and beside the victim: what fairness costs it.
``--no-key-share`` turns the edge's per-key caps off, to see the region's fair scheduling alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from bench import peers
from edge.config import EMBEDDING_MODEL
from edge.keys import KeyStore
from harness.client import Stream, stream_once
from harness.procs import ManagedProcess, free_port
from harness.stats import percentile
from nearshore.children import nearshore_argv
from nearshore.tomlw import dumps
from regional.scheduler import SHARED_WINDOW_S

MODEL = peers.MODEL
TARGET_RATIO = 2.0
FLOOD_ALONE_S = 6.0
PREFILL_METRIC = "nearshore:prefill_tokens_total"


@dataclass(frozen=True)
class FairnessBench:
    """The run's settings (the command's flags)."""

    flood: int = 4  # the flood key's requests in flight at once
    flood_tokens: int = 3500  # about this many prompt tokens each
    echo: bool = False  # echo + logprobs=20 completions instead of long prompts
    embeddings: int = 0  # > 0: embeddings of this many short texts each instead (the region's embedder)
    chats: int = 24  # the victim's chats, per phase
    threads: int = 0  # llama.cpp threads (0: one per core)
    key_share: bool = True  # the edge's per-key caps ([pools.key_share]) at their defaults
    shared_step_ms: float | None = None  # the region's [engine] shared_step_ms (None: its default)
    logs: str = ""  # folder for the servers' logs ("": a temp folder)
    json: str | None = None  # also write the report here


def flood_body(bench: FairnessBench, n: int) -> dict:
    if bench.embeddings:
        texts = [f"Ledger {n}, line {i}: apples and oranges." for i in range(bench.embeddings)]
        return {"model": EMBEDDING_MODEL, "input": texts}
    # A word a token; a distinct first line, so no request reuses another's cached prefix.
    prompt = f"Ledger {n}:" + " apples" * (1000 if bench.echo else bench.flood_tokens)
    if bench.echo:
        return {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 20, "max_tokens": 1}
    return {"model": MODEL, "prompt": prompt, "max_tokens": 64, "temperature": 0}


def chat_body(n: int) -> bytes:
    question = f"Hi, I am guest {n}. How are you?"
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 8}
    return json.dumps({**body, "stream": True}).encode()


def start_edge(logs: Path, region_url: str, key_share: bool) -> tuple[peers.Endpoint, dict[str, str]]:
    """An edge in front of the region with two keys no rate limit stops: (edge with the victim's headers,
    the flood's headers). The cache is off: the victim's chats must reach the region."""
    folder = logs / "edge"
    folder.mkdir(parents=True, exist_ok=True)
    store = KeyStore(folder / "keys.sqlite3")
    try:
        victim, _ = store.create(tenant="victim", rpm=10**9, tpm=10**12)
        flood, _ = store.create(tenant="flood", rpm=10**9, tpm=10**12)
    finally:
        store.close()
    port = free_port()
    config: dict[str, object] = {
        "keys_db": folder / "keys.sqlite3",
        "ledger_db": folder / "ledger.sqlite3",
        "server": {"port": port},
        "tls": {"enabled": False},
        "metrics": {"port": 0},
        "cache": {"enabled": False},
        "upstream": {"health_interval_s": 1.0},
        "regions": [{"name": "london", "url": region_url}],
    }
    if not key_share:
        config["pools"] = {"key_share": {"max_concurrent": 0, "max_tokens_in_flight": 0}}
    (folder / "edge.toml").write_text(dumps(config))
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess(
        "edge", nearshore_argv("edge", "--config", str(folder / "edge.toml")), logs / "edge.log"
    )
    process.start()
    try:
        process.wait_http(url + "/health", timeout_s=60)
    except BaseException:
        process.stop()
        raise
    headers = {**peers.JSON, "Authorization": f"Bearer {victim}"}
    return peers.Endpoint("edge", url, headers, process, None, folder), {
        **peers.JSON,
        "Authorization": f"Bearer {flood}",
    }


async def _victim(
    session: aiohttp.ClientSession, edge: peers.Endpoint, chats: int, first: int
) -> list[Stream]:
    streams = []
    for n in range(first, first + chats):
        stream = await stream_once(
            session, edge.url + "/v1/chat/completions", chat_body(n), edge.headers, Stream()
        )
        streams.append(stream)
        await asyncio.sleep(0.2)  # a person reading the answer
    return streams


async def _flood_worker(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    bench: FairnessBench,
    first: int,
    tally: dict,
) -> None:
    n = first
    while True:
        n += bench.flood
        path = "/v1/embeddings" if bench.embeddings else "/v1/completions"
        async with session.post(url + path, json=flood_body(bench, n), headers=headers) as r:
            answer = await r.read()
            tally[r.status] = tally.get(r.status, 0) + 1
            if r.status == 429:
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
            elif r.status != 200:
                tally.setdefault("error", answer[:300].decode(errors="replace"))
                await asyncio.sleep(1.0)


async def _prefilled(session: aiohttp.ClientSession, region_url: str) -> tuple[float, float]:
    """(now, prompt tokens the region's steps have computed so far), from its /metrics."""
    async with session.get(region_url + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith(PREFILL_METRIC):
            return time.perf_counter(), float(line.rsplit(" ", 1)[1])
    raise RuntimeError(f"the region's /metrics has no {PREFILL_METRIC}")


def _rate(a: tuple[float, float], b: tuple[float, float]) -> float:
    return (b[1] - a[1]) / (b[0] - a[0])


async def _measure(
    edge: peers.Endpoint, region_url: str, flood_headers: dict[str, str], bench: FairnessBench
) -> dict:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await _victim(session, edge, 2, 10_000)  # warm: the model's first steps, the edge's connections
        unloaded = await _victim(session, edge, bench.chats, 0)
        tally: dict[int, int] = {}
        workers = [
            asyncio.create_task(_flood_worker(session, edge.url, flood_headers, bench, i, tally))
            for i in range(bench.flood)
        ]
        started = time.perf_counter()
        try:
            # The flood fills the region, and the region forgets the victim was there (its shared steps) ...
            await asyncio.sleep(SHARED_WINDOW_S + 0.5)
            alone_from = await _prefilled(session, region_url)
            await asyncio.sleep(FLOOD_ALONE_S)  # ... and runs alone a while: what fairness costs it
            beside_from = await _prefilled(session, region_url)
            loaded = await _victim(session, edge, bench.chats, bench.chats)
            beside_to = await _prefilled(session, region_url)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        loaded_s = time.perf_counter() - started
    return {
        "unloaded": _summary(unloaded),
        "loaded": _summary(loaded),
        "flood": tally,
        "loaded_s": loaded_s,
        "flood_prefill_per_s": {
            "alone": _rate(alone_from, beside_from),
            "beside_victim": _rate(beside_from, beside_to),
        },
    }


def _summary(streams: list[Stream]) -> dict:
    ok = [s.ttft_s * 1000 for s in streams if not s.error]
    return {
        "ok": len(ok),
        "errors": sorted({s.error for s in streams if s.error}),
        "ttft_p50_ms": percentile(ok, 50),
        "ttft_p95_ms": percentile(ok, 95),
    }


def run(bench: FairnessBench) -> dict:
    with tempfile.TemporaryDirectory(prefix="nearshore-bench-fairness-") as tmp:
        logs = Path(bench.logs or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            settings = {} if bench.shared_step_ms is None else {"shared_step_ms": bench.shared_step_ms}
            region = peers.start_region(logs, "", bench.threads, 16, engine_settings=settings)
            stack.callback(region.stop)
            edge, flood_headers = start_edge(logs, region.url, bench.key_share)
            stack.callback(edge.stop)
            _wait_for_keys(edge, flood_headers)
            measured = asyncio.run(_measure(edge, region.url, flood_headers, bench))
    ratio = measured["loaded"]["ttft_p50_ms"] / measured["unloaded"]["ttft_p50_ms"]
    return {"settings": asdict(bench), **measured, "p50_ratio": ratio, "met": ratio <= TARGET_RATIO}


def _wait_for_keys(edge: peers.Endpoint, flood_headers: dict[str, str], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    for headers in (edge.headers, flood_headers):
        request = urllib.request.Request(edge.url + "/v1/models", headers=headers)
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the edge did not load the bench's keys")
            time.sleep(0.05)


def format_report(report: dict) -> str:
    s = report["settings"]
    what = "echo + logprobs=20 completions" if s["echo"] else f"prompts of ~{s['flood_tokens']} tokens"
    if s["embeddings"]:
        what = f"embeddings of {s['embeddings']} texts"
    lines = [
        f"victim: {s['chats']} short streamed chats; flood: {s['flood']} {what} in flight at once "
        f"(edge key shares {'on' if s['key_share'] else 'off'}; region shared_step_ms "
        f"{'default' if s['shared_step_ms'] is None else s['shared_step_ms']})",
        f"{'phase':<10} {'ok':>3} {'TTFT p50 ms':>12} {'p95 ms':>9}",
    ]
    for phase in ("unloaded", "loaded"):
        p = report[phase]
        lines.append(f"{phase:<10} {p['ok']:>3} {p['ttft_p50_ms']:>12.0f} {p['ttft_p95_ms']:>9.0f}")
        if p["errors"]:
            lines.append(f"           errors: {'; '.join(p['errors'])[:300]}")
    counts = {k: v for k, v in report["flood"].items() if k != "error"}
    flood = ", ".join(f"HTTP {k}: {v}" for k, v in sorted(counts.items())) or "none finished"
    if "error" in report["flood"]:
        flood += f" (e.g. {report['flood']['error']})"
    lines.append(f"flood answers in {report['loaded_s']:.0f}s: {flood}")
    rates = report["flood_prefill_per_s"]
    if s["embeddings"]:
        embedded = report["flood"].get(200, 0) * s["embeddings"] / report["loaded_s"]
        lines.append(f"texts embedded per second while loaded: {embedded:.0f}")
    else:
        lines.append(
            f"flood's prompt tokens prefilled per second: {rates['alone']:.0f} alone, "
            f"{rates['beside_victim']:.0f} beside the victim (what sharing the node costs it)"
        )
    verdict = "met" if report["met"] else "MISSED"
    lines.append(
        f"loaded / unloaded TTFT p50: {report['p50_ratio']:.2f}x (target <= {TARGET_RATIO:g}x): {verdict}"
    )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = FairnessBench()
    parser.add_argument(
        "--flood", type=int, default=d.flood, help=f"the flood's requests in flight (default {d.flood})"
    )
    parser.add_argument(
        "--flood-tokens", type=int, default=d.flood_tokens, help="prompt tokens of each (default 3500)"
    )
    parser.add_argument("--echo", action="store_true", help="flood with echo + logprobs=20 completions")
    parser.add_argument(
        "--embeddings", type=int, default=0, metavar="TEXTS", help="flood with embeddings of TEXTS texts each"
    )
    parser.add_argument(
        "--chats", type=int, default=d.chats, help=f"victim chats per phase (default {d.chats})"
    )
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: one per core)")
    parser.add_argument("--no-key-share", action="store_true", help="the edge's per-key caps off")
    parser.add_argument(
        "--shared-step-ms",
        type=float,
        default=None,
        help="the region's [engine] shared_step_ms (default: its own; 0: prefill_chunk alone)",
    )
    parser.add_argument("--logs", default="", help="keep the servers' logs here")
    parser.add_argument("--json", default=None, help="also write the report here")


def from_args(args: argparse.Namespace) -> FairnessBench:
    return FairnessBench(
        args.flood,
        args.flood_tokens,
        args.echo,
        args.embeddings,
        args.chats,
        args.threads,
        not args.no_key_share,
        args.shared_step_ms,
        args.logs,
        args.json,
    )


def run_and_print(bench: FairnessBench) -> None:
    report = run(bench)
    print(format_report(report))
    if bench.json:
        Path(bench.json).write_text(json.dumps(report, indent=2, default=str))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="nearshore bench fairness", description=__doc__.splitlines()[0])
    add_arguments(parser)
    run_and_print(from_args(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
