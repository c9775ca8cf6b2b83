"""Every config and CLI value is checked at start, with the file and the key named, in one line (issue 19,
item 7): non-finite prices and timeouts, an empty model list, a bad redis_url, key and ledger files that
cannot be opened, a key store that is new and empty, a KV pool too big to allocate, `keys create` bounds."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cli import build_parser
from cli.keys import MAX_PER_MINUTE
from edge.config import EdgeConfig, non_finite_numbers, open_named_file, value_problems
from edge.keys import KeyStore
from edge.ledger import Ledger
from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv
from nearshore.config import ConfigError, load_config
from nearshore.tomlw import dumps
from regional.config import MAX_KV_CACHE_TOKENS, EngineConfig, RegionConfig
from regional.engine import EngineFailed
from regional.kv_slots import SlotMemory
from regional.scheduler import KvMemory
from regional.step_engine import StepEngine

MODEL = "gemma-3-270m"
ONE_MODEL = f'models = ["{MODEL}"]\n'


def edge_toml(folder: Path, extra: str = "", top: str = ONE_MODEL, ledger_db: Path | None = None) -> str:
    """An edge config that starts (one dead region, no TLS, no cache), plus ``extra``."""
    ledger_db = ledger_db or folder / "ledger.sqlite3"
    return (
        f'{top}keys_db = "{folder / "keys.sqlite3"}"\nledger_db = "{ledger_db}"\n'
        "[server]\nport = 0\n[tls]\nenabled = false\n[metrics]\nport = 0\n[cache]\nenabled = false\n"
        '[[regions]]\nname = "london"\nurl = "http://127.0.0.1:9"\n'
        f"{extra}"
    )


def price(cached_input: str) -> str:
    return f'[prices."{MODEL}"]\ninput = 0.05\ncached_input = {cached_input}\noutput = 0.2\n'


def load_edge(tmp_path: Path, text: str) -> EdgeConfig:
    path = tmp_path / "edge.toml"
    path.write_text(text)
    return load_config(path, EdgeConfig)


# --- edge values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "1e400"])  # 1e400 reads as inf too
def test_an_infinite_price_is_refused_naming_the_model_and_field(tmp_path, value):
    config = load_edge(tmp_path, edge_toml(tmp_path, price(value)))
    assert value_problems(config) == [f'prices."{MODEL}".cached_input: inf is not a finite number']


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("-0.01", "must be >= 0 (USD per million tokens), not -0.01"),
        ("nan", "nan is not a finite number"),
        ("-inf", "-inf is not a finite number"),
    ],
)
def test_a_negative_or_nan_price_is_refused_naming_the_model_and_field(tmp_path, value, why):
    config = load_edge(tmp_path, edge_toml(tmp_path, price(value)))
    assert value_problems(config)[0] == f'prices."{MODEL}".cached_input: {why}'


def test_every_non_finite_number_is_named_wherever_it_is():
    config = EdgeConfig(models=[MODEL])
    config.upstream.ttft_timeout_s = float("inf")
    config.pools.key_share.max_wait_s = float("nan")
    assert non_finite_numbers(config) == [  # in the order of the file's sections
        "pools.key_share.max_wait_s: nan is not a finite number",
        "upstream.ttft_timeout_s: inf is not a finite number",
    ]
    assert non_finite_numbers({"a": [1.0, float("-inf")]}, "x") == ['x."a"[1]: -inf is not a finite number']
    assert non_finite_numbers(EdgeConfig()) == []


@pytest.mark.parametrize(
    ("top", "expected"),
    [("models = []\n", "models: Expected `array` of length >= 1"), ('models = [""]\n', "models[0]:")],
)
def test_an_empty_models_list_or_name_is_refused(tmp_path, top, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)) as error:
        load_edge(tmp_path, edge_toml(tmp_path, top=top))
    assert str(tmp_path / "edge.toml") in str(error.value)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("localhost:6379", "must specify one of the following schemes"),
        ("redis://:hunter2@cache:99999/0", "Port out of range"),
    ],
)
def test_a_bad_redis_url_names_limits_redis_url_and_not_the_password(tmp_path, url, why):
    extra = f'[limits]\nbackend = "redis"\nredis_url = "{url}"\n'
    problems = value_problems(load_edge(tmp_path, edge_toml(tmp_path, extra)))
    assert len(problems) == 1 and problems[0].startswith("limits.redis_url: ") and why in problems[0]
    assert "hunter2" not in problems[0]


def test_an_unused_redis_url_is_not_checked(tmp_path):
    config = load_edge(tmp_path, edge_toml(tmp_path, '[limits]\nredis_url = "later"\n'))
    assert value_problems(config) == []


def test_a_ledger_or_key_file_that_cannot_be_opened_is_one_line_with_key_path_and_reason(tmp_path):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database\n" * 100)
    cases = [
        ("ledger_db", folder, Ledger, f"ledger_db: cannot open {folder}: Is a directory"),
        ("keys_db", folder, KeyStore, f"keys_db: cannot open {folder}: Is a directory"),
        ("ledger_db", not_sqlite, Ledger, f"ledger_db: cannot open {not_sqlite}: file is not a database"),
        ("keys_db", not_sqlite, KeyStore, f"keys_db: cannot open {not_sqlite}: file is not a database"),
        (
            "ledger_db",
            not_sqlite / "ledger.sqlite3",
            Ledger,
            f"ledger_db: cannot create the folder {not_sqlite}: a file, not a folder",
        ),
    ]
    for key, path, opener, expected in cases:
        with pytest.raises(ValueError) as error:
            open_named_file(key, path, opener)
        assert str(error.value) == expected


def test_a_key_store_knows_whether_it_was_just_created(tmp_path):
    path = tmp_path / "keys.sqlite3"
    first = KeyStore(path)
    assert first.created
    first.close()
    again = KeyStore(path)
    assert not again.created
    again.close()


async def test_an_edge_on_a_new_key_store_says_so_in_one_line(tmp_path, caplog):
    from edge.app import EDGE
    from edge.node import build_edge_app

    config = load_edge(tmp_path, edge_toml(tmp_path))
    with caplog.at_level(logging.WARNING, logger="nearshore.edge"):
        app = build_edge_app(config)
    state = app[EDGE]
    try:
        lines = [r.getMessage() for r in caplog.records if "keys_db" in r.getMessage()]
        path = tmp_path / "keys.sqlite3"
        assert lines == [
            f"keys_db: the key store {path} is new and empty: every request gets 401 until keys are "
            f"created (nearshore keys create --db {path} --tenant NAME)"
        ]
        caplog.clear()
        state.keys.create("acme")  # with a key, the next start says nothing
        with caplog.at_level(logging.WARNING, logger="nearshore.edge"):
            second = build_edge_app(config)
        assert not [r for r in caplog.records if "keys_db" in r.getMessage()]
        second[EDGE].keys.close()
        await second[EDGE].ledger.close()
    finally:
        state.keys.close()
        await state.ledger.close()


# --- `nearshore keys` -----------------------------------------------------------------------------------


def cli(argv: list[str]) -> int:
    """``nearshore ARGV`` in this process, without main()'s logging setup."""
    args = build_parser().parse_args(argv)
    return args.run(args)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rpm", "1e20"], "argument --rpm: must be from 1 to 1e15, not 1e20"),
        (["--tpm", str(MAX_PER_MINUTE + 1)], "argument --tpm: must be from 1 to 1e15"),
        (["--rpm", "0"], "argument --rpm: must be from 1 to 1e15, not 0"),
        (["--rpm", "1.5"], "argument --rpm: expected a whole number, not '1.5'"),
        (["--rpm", "nan"], "argument --rpm: expected a whole number"),
        (["--tenant", ""], "argument --tenant: must not be empty"),
        (["--tenant", "  "], "argument --tenant: must not be empty"),
        (["--tenant", "a\nb"], "argument --tenant: must be printable, one line"),
        (["--tier", ""], "argument --tier: must not be empty"),
        (["--model", ""], "argument --model: must not be empty"),
        (["--budget", "inf"], "argument --budget: must be a finite number, 0 or more, not inf"),
        (["--budget", "-1"], "argument --budget: must be a finite number, 0 or more"),
    ],
)
def test_keys_create_refuses_a_bad_value_in_one_line(tmp_path, capsys, args, expected):
    db = tmp_path / "keys.sqlite3"
    with pytest.raises(SystemExit) as exited:
        cli(["keys", "create", "--tenant", "acme", "--db", str(db), *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nearshore keys create: error: ") and expected in err
    assert not db.exists()  # refused before the store is touched


def test_keys_create_reads_1e6_as_a_million(tmp_path, capsys):
    db = tmp_path / "keys.sqlite3"
    assert cli(["keys", "create", "--tenant", "acme", "--rpm", "1e6", "--db", str(db)]) == 0
    store = KeyStore(db)
    assert [k.rpm for k in store.list()] == [1_000_000]
    store.close()


def test_keys_and_usage_on_a_file_they_cannot_use_say_so_in_one_line(tmp_path, capsys):
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database\n" * 100)
    runs = [
        (
            ["keys", "create", "--tenant", "acme", "--db", str(tmp_path)],
            f"cannot open {tmp_path}: Is a directory",
        ),
        (["keys", "list", "--db", str(not_sqlite)], f"cannot open {not_sqlite}: file is not a database"),
        (["usage", "--db", str(not_sqlite)], f"cannot open {not_sqlite}: file is not a database"),
    ]
    for argv, expected in runs:
        assert cli(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--db: {expected}" in err, (argv, err)


# --- region values --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"[engine]\nkv_cache_tokens = {MAX_KV_CACHE_TOKENS + 1}\n",
            "engine.kv_cache_tokens: Expected `int` <=",
        ),
        ("[engine]\nshared_step_ms = inf\n", "engine.shared_step_ms: Expected `float` <="),
        ("[engine]\nidle_unload_s = inf\n", "engine.idle_unload_s: Expected `float` <="),
        ("[engine]\nfailed_exit_delay_s = inf\n", "engine.failed_exit_delay_s: Expected `float` <="),
        ("[engine]\nn_threads = 100000\n", "engine.n_threads: Expected `int` <="),
    ],
)
def test_region_values_past_their_bounds_name_file_and_key(tmp_path, text, expected):
    path = tmp_path / "region.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {expected}")):
        load_config(path, RegionConfig)


class _UnloadableEngine(StepEngine):
    """An engine whose model never loads, as when its KV pool cannot be allocated."""

    kind = "test"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__("m", "/nowhere.gguf", config)
        self.loads = 0

    def _load_backend(self):
        self.loads += 1
        raise MemoryError("cannot allocate the KV cache")

    def _close_backend(self) -> None:
        pass

    def _new_memory(self) -> KvMemory:
        return SlotMemory(self.config.max_sequences, self.config.kv_cache_tokens)


async def test_a_model_that_does_not_load_fails_the_engine_for_good():
    engine = _UnloadableEngine(EngineConfig(load="lazy", kv_cache_tokens=1024, context_window=512))
    told: list[str] = []
    engine.on_fatal = told.append
    await engine.start()
    try:
        for _ in range(2):  # the second ask does not load again: it gets the same failure
            with pytest.raises(EngineFailed, match="model load failed: cannot allocate the KV cache"):
                await engine.ready()
        assert engine.loads == 1
        stats = engine.stats()
        assert stats.state == "failed" and stats.failure == "model load failed: cannot allocate the KV cache"
        await asyncio.sleep(0)  # the node's fatal handler runs on the loop
        assert told == [stats.failure]
    finally:
        await engine.close()


def test_a_context_llama_cpp_cannot_allocate_names_kv_cache_tokens(monkeypatch):
    pytest.importorskip("llama_cpp")
    import regional.llama_engine as llama_engine
    from regional.llama_model import LlamaError

    def no_context(*_args, **_kwargs):
        raise LlamaError(f"{llama_engine.CONTEXT_FAILED} (n_ctx=1048576)")

    monkeypatch.setattr(llama_engine, "LlamaModel", no_context)
    engine = llama_engine.LlamaCppEngine(MODEL, "/m.gguf", EngineConfig(kv_cache_tokens=1 << 20))
    with pytest.raises(LlamaError, match=r"engine\.kv_cache_tokens = 1048576 may need more memory"):
        engine._load_backend()

    def no_file(*_args, **_kwargs):
        raise LlamaError("llama.cpp could not load the model file /m.gguf")

    monkeypatch.setattr(llama_engine, "LlamaModel", no_file)
    with pytest.raises(LlamaError, match=r"could not load the model file /m\.gguf$"):
        engine._load_backend()


# --- real processes: exit non-zero, one line naming file and key, no traceback ----------------------------


@pytest.mark.slow
def test_edge_and_cli_misuse_is_one_line_and_a_non_zero_exit(tmp_path):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    redis = '[limits]\nbackend = "redis"\nredis_url = "localhost:6379"\n'
    edge_cases = {
        "price": (
            price("inf"),
            ONE_MODEL,
            None,
            f'prices."{MODEL}".cached_input: inf is not a finite number',
        ),
        "models": ("", "models = []\n", None, "models: Expected `array` of length >= 1"),
        "redis": (redis, ONE_MODEL, None, "limits.redis_url: "),
        "ledger": ("", ONE_MODEL, folder, f"ledger_db: cannot open {folder}: Is a directory"),
    }
    runs: dict[str, tuple[list[str], int, str]] = {}
    for name, (extra, top, ledger_db, expected) in edge_cases.items():
        case = tmp_path / name
        case.mkdir()
        path = case / "edge.toml"
        path.write_text(edge_toml(case, extra, top, ledger_db))
        runs[name] = (nearshore_argv("edge", "--config", str(path)), 2, f"config error: {path}: {expected}")
    db = tmp_path / "keys.sqlite3"
    runs["rpm"] = (
        nearshore_argv("keys", "create", "--tenant", "acme", "--rpm", "1e20", "--db", str(db)),
        2,
        "nearshore keys create: error: argument --rpm: must be from 1 to 1e15, not 1e20",
    )
    runs["tenant"] = (
        nearshore_argv("keys", "create", "--tenant", "", "--db", str(db)),
        2,
        "nearshore keys create: error: argument --tenant: must not be empty",
    )
    runs["keys-db"] = (
        nearshore_argv("keys", "create", "--tenant", "acme", "--db", str(folder)),
        1,
        f"--db: cannot open {folder}: Is a directory",
    )
    started = {
        name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for name, (argv, _, _) in runs.items()
    }
    try:
        for name, proc in started.items():
            out, err = (b.decode(errors="replace") for b in proc.communicate(timeout=90))
            _, code, expected = runs[name]
            assert proc.returncode == code, (name, err)
            assert "Traceback" not in err and out == "", (name, err)
            assert len(err.strip().splitlines()) == 1 and expected in err, (name, err)
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
def test_an_edge_on_a_new_key_store_starts_and_says_every_request_gets_401(tmp_path):
    path = tmp_path / "edge.toml"
    path.write_text(edge_toml(tmp_path))
    log_path = tmp_path / "edge.log"
    with ManagedProcess("edge", nearshore_argv("edge", "--config", str(path)), log_path):
        deadline = time.monotonic() + 60
        while "serving on" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = log_path.read_text()
    assert "serving on" in text, text
    warned = [line for line in text.splitlines() if "keys_db" in line]
    assert len(warned) == 1, text
    assert f"the key store {tmp_path / 'keys.sqlite3'} is new and empty" in warned[0] and "401" in warned[0]


def _memory_beyond(gib: float) -> bool:
    """Whether this machine could map ``gib`` GiB at once (RAM and swap, or overcommit always allowed)."""
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        overcommit = Path("/proc/sys/vm/overcommit_memory").read_text().strip()
    except OSError:
        return True
    total_kib = sum(int(meminfo[k].split()[0]) for k in ("MemTotal", "SwapTotal"))
    return overcommit == "1" or total_kib / 2**20 >= gib


def _get(url: str, data: bytes | None = None) -> tuple[int, dict, dict]:
    headers = {"Content-Type": "application/json"} if data else {}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


@pytest.mark.slow
def test_a_kv_pool_too_big_to_allocate_fails_the_region_with_503_and_says_why(tmp_path):
    # The config's own upper bound: ~48 GiB of KV for the embedded model, which must not fit here.
    if _memory_beyond(40):
        pytest.skip("this machine might allocate the whole KV pool")
    port = free_port()
    config = tmp_path / "region.toml"
    engine = {"kind": "llama.cpp", "kv_cache_tokens": MAX_KV_CACHE_TOKENS, "failed_exit_delay_s": 8.0}
    config.write_text(dumps({"server": {"port": port}, "engine": engine, "embeddings": {"enabled": False}}))
    log_path = tmp_path / "region.log"
    url = f"http://127.0.0.1:{port}"
    with ManagedProcess("region", nearshore_argv("region", "--config", str(config)), log_path) as region:
        assert region.proc is not None
        deadline = time.monotonic() + 120
        health: tuple[int, dict, dict] | None = None
        while time.monotonic() < deadline and region.proc.poll() is None:
            try:
                health = _get(url + "/health")
            except (urllib.error.URLError, ConnectionError, OSError):
                health = None
            if health is not None and health[2]["model"] != "loading":
                break
            time.sleep(0.1)
        assert health is not None, region.log_tail()
        status, _, body = health
        assert status == 503 and body["status"] == "failed", body
        assert "engine.kv_cache_tokens = 16777216" in body["reason"], body
        ready = _get(url + "/health/ready")
        assert ready[0] == 503 and ready[2]["reason"] == body["reason"]
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        status, headers, answer = _get(url + "/v1/chat/completions", json.dumps(chat).encode())
        assert status == 503 and int(headers["Retry-After"]) >= 1, answer
        assert (
            answer["error"]["code"] == "engine_failed"
            and "engine.kv_cache_tokens" in answer["error"]["message"]
        )
        assert region.proc.wait(timeout=60) == 70  # the node exits for its supervisor
    text = log_path.read_text()
    assert "Traceback" not in text, text


def test_a_workers_supervisor_checks_the_ledger_and_key_store_before_any_worker(tmp_path):
    from edge.node import check_files

    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(
        ValueError, match=rf"^ledger_db: cannot open {re.escape(str(folder))}: Is a directory"
    ):
        check_files(EdgeConfig(models=[MODEL], ledger_db=str(folder), keys_db=str(tmp_path / "keys.sqlite3")))
    not_a_db = tmp_path / "keys.sqlite3"
    not_a_db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ValueError, match=r"^keys_db: cannot open .*: file is not a database"):
        check_files(EdgeConfig(models=[MODEL], ledger_db=str(tmp_path / "l.sqlite3"), keys_db=str(not_a_db)))
