"""An edge config survives an upgrade and cannot be set to values that hurt (issue 34, item 6 and N14).

A renamed key (``upstream.first_byte_timeout_s``, now ``upstream.ttft_timeout_s``) is read under its new
name with a warning, or refused naming the new key; never a bare "unknown key". Counts and intervals are
bounded (``warm_connections = 100000`` once spun a core, ``health_interval_s = 1e-9`` too), the key store
and the ledger must sit in folders that exist (a typo made folders at /) and must be two files. Each is
refused at start, with the file and the key named, by the loader and by the real ``nearshore edge``.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
import tomllib
from pathlib import Path

import msgspec
import pytest

from edge.config import (
    DATA_DIR,
    RENAMED_KEYS,
    EdgeConfig,
    ServerConfig,
    UpstreamConfig,
    file_problems,
    value_problems,
)
from geo.catalog import HealthSettings
from harness.procs import ManagedProcess
from nearshore.children import nearshore_argv
from nearshore.config import ConfigError, load_config

MODEL = "gemma-3-270m"


def edge_toml(
    folder: Path, extra: str = "", keys_db: Path | str = "", ledger_db: Path | str = "", server: str = ""
) -> str:
    """An edge config that starts (one dead region, no TLS, no cache, one free model), plus ``extra`` (and
    ``server``'s lines in its [server] section)."""
    keys_db = keys_db or folder / "keys.sqlite3"
    ledger_db = ledger_db or folder / "ledger.sqlite3"
    return (
        f'models = ["{MODEL}"]\nkeys_db = "{keys_db}"\nledger_db = "{ledger_db}"\n'
        f"[server]\nport = 0\n{server}[tls]\nenabled = false\n[metrics]\nport = 0\n[cache]\nenabled = false\n"
        '[[regions]]\nname = "london"\nurl = "http://127.0.0.1:9"\n'
        f"{extra}"
    )


def load_edge(tmp_path: Path, text: str) -> EdgeConfig:
    path = tmp_path / "edge.toml"
    path.write_text(text)
    return load_config(path, EdgeConfig)


# --- item 6: renamed keys -------------------------------------------------------------------------------


def test_a_renamed_key_is_read_under_its_new_name_with_a_warning(tmp_path, caplog):
    extra = "[upstream]\nfirst_byte_timeout_s = 45\nidle_timeout_s = 12\n"
    with caplog.at_level(logging.WARNING, logger="nearshore.config"):
        config = load_edge(tmp_path, edge_toml(tmp_path, extra))
    assert config.upstream.ttft_timeout_s == 45 and config.upstream.stall_timeout_s == 12
    warnings = [r.getMessage() for r in caplog.records]
    path = tmp_path / "edge.toml"
    assert warnings == [
        f"{path}: upstream.first_byte_timeout_s is renamed to upstream.ttft_timeout_s: read as "
        "upstream.ttft_timeout_s (rename it in the file)",
        f"{path}: upstream.idle_timeout_s is renamed to upstream.stall_timeout_s: read as "
        "upstream.stall_timeout_s (rename it in the file)",
    ]


def test_a_renamed_key_beside_its_new_name_is_refused_naming_both(tmp_path):
    extra = "[upstream]\nfirst_byte_timeout_s = 45\nttft_timeout_s = 3\n"
    with pytest.raises(ConfigError) as error:
        load_edge(tmp_path, edge_toml(tmp_path, extra))
    assert str(error.value) == (
        f"{tmp_path / 'edge.toml'}: upstream.first_byte_timeout_s: renamed to upstream.ttft_timeout_s, "
        "which is set too; remove upstream.first_byte_timeout_s"
    )


def test_a_moved_key_that_was_never_read_is_refused_naming_its_new_key(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_edge(tmp_path, edge_toml(tmp_path, "[geo.health]\ninterval_s = 5\n"))
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'edge.toml'}: geo.health.interval_s: renamed to ")
    assert "set upstream.health_interval_s instead" in message and "unknown key" not in message


def test_the_renamed_keys_table_points_from_keys_that_are_gone_to_keys_that_exist():
    def exists(dotted: str) -> bool:
        schema: object = EdgeConfig
        for name in dotted.split("."):
            fields = {f.name: f.type for f in msgspec.structs.fields(schema)}  # type: ignore[arg-type]
            if name not in fields:
                return False
            schema = fields[name]
        return True

    assert "upstream.first_byte_timeout_s" in RENAMED_KEYS
    for old, renamed in RENAMED_KEYS.items():
        assert not exists(old), old
        assert exists(renamed.new), renamed.new
        assert renamed.same_meaning or renamed.why, old


def test_an_unknown_key_that_was_never_renamed_is_still_unknown(tmp_path):
    with pytest.raises(ConfigError, match=r"upstream\.first_token_s: unknown key$"):
        load_edge(tmp_path, edge_toml(tmp_path, "[upstream]\nfirst_token_s = 5\n"))


# --- N14: bounds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("[upstream]\nwarm_connections = 100000\n", "upstream.warm_connections: Expected `int` <= 64"),
        ("[upstream]\npool_size = 1000000000\n", "upstream.pool_size: Expected `int` <= 10000"),
        ("[upstream]\nhealth_interval_s = 1e-9\n", "upstream.health_interval_s: Expected `float` >= 0.1"),
        ("[upstream]\nhealth_interval_s = 1e12\n", "upstream.health_interval_s: Expected `float` <= 3600.0"),
        ("[upstream]\nhealth_timeout_s = 1e-9\n", "upstream.health_timeout_s: Expected `float` >= 0.01"),
        ("[upstream]\nheartbeat_s = 1e-9\n", "upstream.heartbeat_s: Expected `float` >= 0.1"),
        ("[upstream]\nttft_timeout_s = 1e-9\n", "upstream.ttft_timeout_s: Expected `float` >= 0.1"),
        ("[upstream]\nstall_timeout_s = 1e-9\n", "upstream.stall_timeout_s: Expected `float` >= 0.1"),
        ("[upstream]\nconnect_timeout_s = 1e-9\n", "upstream.connect_timeout_s: Expected `float` >= 0.01"),
        ("[upstream]\nmax_retry_after_s = 1e9\n", "upstream.max_retry_after_s: Expected `float` <= 3600.0"),
        ("[upstream]\nmax_retry_wait_s = 1e9\n", "upstream.max_retry_wait_s: Expected `float` <= 3600.0"),
        ("[server]\nwrite_timeout_s = 1e-9\n", "server.write_timeout_s: Expected `float` >= 0.1"),
        ("[geo.health]\nmax_ejection_s = 1e9\n", "geo.health.max_ejection_s: Expected `float` <= 3600.0"),
        (
            "[geo.health]\nhealthy_threshold = 1000000\n",
            "geo.health.healthy_threshold: Expected `int` <= 100",
        ),
    ],
)
def test_a_count_or_interval_out_of_bounds_is_refused_naming_file_and_key(tmp_path, extra, expected):
    section, line = extra.split("\n", 1)
    text = edge_toml(tmp_path, server=line) if section == "[server]" else edge_toml(tmp_path, extra)
    with pytest.raises(ConfigError) as error:
        load_edge(tmp_path, text)
    assert str(error.value) == f"{tmp_path / 'edge.toml'}: {expected}"


def test_more_warm_connections_than_the_pool_keeps_is_refused(tmp_path):
    config = load_edge(tmp_path, edge_toml(tmp_path, "[upstream]\npool_size = 8\nwarm_connections = 9\n"))
    assert value_problems(config) == [
        "upstream.warm_connections: must be at most upstream.pool_size (8), not 9"
    ]


def test_a_key_store_or_ledger_in_a_folder_that_does_not_exist_is_refused(tmp_path, monkeypatch):
    missing = tmp_path / "missing"
    config = load_edge(tmp_path, edge_toml(tmp_path, keys_db=missing / "keys.sqlite3"))
    assert file_problems(config) == [
        f"keys_db: '{missing / 'keys.sqlite3'}': the folder {missing} does not exist (create it first: the "
        f"edge makes only its default data folder, {DATA_DIR})"
    ]
    monkeypatch.chdir(tmp_path)  # a service's working directory: a relative path is read from it
    config = load_edge(tmp_path, edge_toml(tmp_path, ledger_db="nowhere/ledger.sqlite3"))
    [problem] = file_problems(config)
    assert problem.startswith(
        f"ledger_db: 'nowhere/ledger.sqlite3' (relative to the working directory {tmp_path})"
    )
    assert f"the folder {tmp_path / 'nowhere'} does not exist" in problem
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    config = load_edge(tmp_path, edge_toml(tmp_path, keys_db=a_file / "keys.sqlite3"))
    assert file_problems(config) == [
        f"keys_db: '{a_file / 'keys.sqlite3'}': {a_file} is a file, not a folder"
    ]
    assert not missing.exists() and not (tmp_path / "nowhere").exists()


def test_the_default_data_folder_is_still_made_on_first_start():
    assert file_problems(EdgeConfig()) == []  # ~/.local/share/nearshore: README's first run


@pytest.mark.parametrize(
    "ledger_db", ["{folder}/keys.sqlite3", "{folder}/sub/../keys.sqlite3", "{folder}/link"]
)
def test_a_ledger_that_is_the_key_store_is_refused(tmp_path, ledger_db):
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "keys.sqlite3")
    config = load_edge(tmp_path, edge_toml(tmp_path, ledger_db=ledger_db.format(folder=tmp_path)))
    assert file_problems(config) == [
        f"ledger_db: the same file as keys_db ({tmp_path / 'keys.sqlite3'}): the ledger and the key store "
        "each need their own"
    ]


def test_the_shipped_edge_config_documents_every_bounded_setting_at_its_default():
    """configs/edge.toml names each setting of these sections (max_retry_after_s too), at its default."""
    root = Path(__file__).resolve().parents[2]
    shipped = tomllib.loads((root / "configs" / "edge.toml").read_text())
    sections = {
        "upstream": (shipped["upstream"], UpstreamConfig()),
        "server": (shipped["server"], ServerConfig()),
        "geo.health": (shipped["geo"]["health"], HealthSettings()),
    }
    for name, (section, defaults) in sections.items():
        assert section == msgspec.structs.asdict(defaults), name


# --- the real command -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_nearshore_edge_refuses_each_with_one_line_naming_file_and_key(tmp_path):
    """Each stops ``nearshore edge`` at start (status 2, one line, no traceback), before it makes a folder."""
    cases = {
        "warm": (
            "[upstream]\nwarm_connections = 100000\n",
            {},
            "upstream.warm_connections: Expected `int` <= 64",
        ),
        "interval": (
            "[upstream]\nhealth_interval_s = 1e-9\n",
            {},
            "upstream.health_interval_s: Expected `float` >= 0.1",
        ),
        "folder": (
            "",
            {"keys_db": "{case}/missing/keys.sqlite3"},
            "keys_db: '{case}/missing/keys.sqlite3': ",
        ),
        "same": ("", {"ledger_db": "{case}/keys.sqlite3"}, "ledger_db: the same file as keys_db"),
        "renamed-twice": (
            "[upstream]\nfirst_byte_timeout_s = 60\nttft_timeout_s = 30\n",
            {},
            "upstream.first_byte_timeout_s: renamed to upstream.ttft_timeout_s, which is set too",
        ),
        "never-read": (
            "[geo.health]\ninterval_s = 5\n",
            {},
            "geo.health.interval_s: renamed to upstream.health",
        ),
    }
    started = {}
    for name, (extra, files, expected) in cases.items():
        case = tmp_path / name
        case.mkdir()
        path = case / "edge.toml"
        path.write_text(edge_toml(case, extra, **{k: v.format(case=case) for k, v in files.items()}))
        argv = nearshore_argv("edge", "--config", str(path))
        started[name] = (
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE),
            path,
            expected,
        )
    try:
        for name, (proc, path, expected) in started.items():
            out, err = (b.decode(errors="replace") for b in proc.communicate(timeout=90))
            expected = expected.format(case=path.parent)
            assert proc.returncode == 2, (name, err)
            assert "Traceback" not in err and out == "", (name, err)
            assert err.strip().splitlines() == [err.strip()], (name, err)
            assert err.startswith(f"nearshore: config error: {path}: {expected}"), (name, err)
        assert not (tmp_path / "folder" / "missing").exists()
    finally:
        for proc, _, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
def test_nearshore_edge_starts_on_a_config_with_a_renamed_key_and_names_the_new_one(tmp_path):
    path = tmp_path / "edge.toml"
    path.write_text(edge_toml(tmp_path, "[upstream]\nfirst_byte_timeout_s = 60\n"))
    log_path = tmp_path / "edge.log"
    with ManagedProcess("edge", nearshore_argv("edge", "--config", str(path)), log_path):
        deadline = time.monotonic() + 60
        while "serving on" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = log_path.read_text()
    assert "serving on" in text and "unknown key" not in text, text
    [warned] = [line for line in text.splitlines() if "first_byte_timeout_s" in line]
    assert re.search(
        r"WARNING .*upstream\.first_byte_timeout_s is renamed to upstream\.ttft_timeout_s", warned
    )
