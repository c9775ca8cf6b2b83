"""Fixtures that start real regional nodes (the real model over HTTP on loopback)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.postgres import PostgresServer
from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv
from nearshore.tomlw import dumps

pytest_plugins = ["tests.timeline", "tests.order"]

# Under pytest-xdist the workers share the cores: each worker's engines (torch here, llama.cpp and torch in
# the nodes it starts: regional/llama_engine.py default_threads) take one thread, not one per core, or their
# threads spin against each other's at every step's barrier.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

MODEL = "gemma-3-270m"
# The second embedded model, instruction-tuned (one node per model: configs/region-small.toml).
SMALL_MODEL = "smollm2-135m"
SMALL_MODEL_SECTION = {
    "name": SMALL_MODEL,
    "aliases": ["smollm2-135m-instruct"],
    "path": "embedded:smollm2-135m-instruct",
}


@dataclass
class Node:
    url: str
    process: ManagedProcess


def write_region_config(path: Path, port: int, sections: dict[str, dict[str, object]]) -> Path:
    server = {"port": port, **sections.pop("server", {})}
    path.write_text(dumps({"name": "test", "server": server, **sections}))
    return path


def start_region(folder: Path, ready_path: str = "/health/ready", **sections: dict[str, object]) -> Node:
    """A region node, ready. Its grammar vocabulary is built by its first structured request unless the
    engine section says otherwise: most test nodes serve none, and the suite's cores are its clock."""
    port = free_port()
    sections = {**sections, "engine": {"grammar_vocabulary": "first_use", **sections.get("engine", {})}}
    config = write_region_config(folder / "region.toml", port, dict(sections))
    process = ManagedProcess(
        "region", nearshore_argv("region", "--config", str(config)), folder / "region.log"
    )
    process.start()
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_http(url + ready_path, timeout_s=180)
    except Exception:
        process.stop()
        raise
    return Node(url, process)


# One shared node for the API tests: small limits so the edge cases are cheap to reach.
SHARED_ENGINE = {"max_sequences": 8, "kv_cache_tokens": 8192, "context_window": 512, "max_waiting": 32}


@pytest.fixture(scope="session")
def region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = start_region(
        tmp_path_factory.mktemp("region"),
        server={"max_body_bytes": 65536},
        engine=SHARED_ENGINE,
        safety={"blocklist": ["banana"]},
    )
    yield node
    node.process.stop()


# The torch engine on the CPU, for the tests that run both engines through the API. Sixteen sequences a step:
# a request for 25 choices decodes in two batches, not seven (the vocabulary's logits, most of a step on the
# CPU, cost less a row in a larger batch; 25 choices of a tool call took 66 s of CPU, not 79).
TORCH_ENGINE = {
    "kind": "gpu",
    "device": "cpu",
    "max_sequences": 16,
    "kv_cache_tokens": 8192,
    "context_window": 1024,
    "batch_tokens": 256,
    "prefill_chunk": 64,
}


@pytest.fixture(scope="session")
def torch_region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = start_region(tmp_path_factory.mktemp("torch-region"), engine=TORCH_ENGINE)
    yield node
    node.process.stop()


@pytest.fixture(scope="session")
def small_region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node on SmolLM2-135M-Instruct (llama.cpp), with the shared node's limits."""
    folder = tmp_path_factory.mktemp("small-region")
    node = start_region(
        folder, model=SMALL_MODEL_SECTION, engine=SHARED_ENGINE, embeddings={"enabled": False}
    )
    yield node
    node.process.stop()


@pytest.fixture(scope="session")
def small_torch_region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node on SmolLM2-135M-Instruct on the torch engine, on the CPU."""
    folder = tmp_path_factory.mktemp("small-torch-region")
    node = start_region(folder, model=SMALL_MODEL_SECTION, engine=TORCH_ENGINE, embeddings={"enabled": False})
    yield node
    node.process.stop()


@dataclass
class Postgres:
    """The session's PostgreSQL server (Debian's) and a fresh database per test: ``url`` names it."""

    server: PostgresServer
    url: str

    async def create_key(self, tenant: str, **settings: object) -> str:
        """A key made in this database's key table, as `nearshore keys create --postgres` makes it."""
        from edge.keys_pg import PgKeyStore

        store = await PgKeyStore(self.url).open()
        try:
            return (await store.create(tenant, **settings))[0]
        finally:
            await store.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    os.environ.update(server.env)  # the password, for every client and edge the tests start (PGPASSWORD)
    yield server
    server.remove()


@pytest.fixture
def postgres(postgres_server: PostgresServer) -> Postgres:
    """A database of its own on the session's server, so that tests never see each other's tables."""
    if not postgres_server.ready():  # a test stopped it and failed before starting it again
        postgres_server.start()
    name = f"t_{uuid.uuid4().hex[:12]}"
    postgres_server.createdb(name)
    return Postgres(postgres_server, postgres_server.url(name))
