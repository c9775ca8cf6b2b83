"""The deployment files (deploy/), validated statically: no Docker engine or cluster runs on this machine.

Dockerfiles are parsed (stages, COPY sources, extras, commands), the compose file's services, mounts and
secrets are checked against the repository, and every kustomization is rendered by kubectl's kustomize and
validated against the Kubernetes schemas offline. Two tests run real processes: the edge under the edge
image's dependencies only, and a region's drain on SIGTERM (the basis of the grace periods).
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import kubernetes_validate
import msgspec
import pytest
import yaml
from aiohttp import web

from edge.config import EdgeConfig
from edge.keys_admin import MIN_TOKEN_CHARS
from edge.node import check_config as check_edge_config
from harness.procs import ManagedProcess, free_port
from nearshore.config import load_config
from nearshore.tomlw import dumps
from regional.config import RegionConfig
from regional.node import check_config as check_region_config
from tests.conftest import Postgres, start_region
from tests.deploy_files import (
    DEPLOY,
    ROOT,
    Dockerfile,
    find,
    kustomize,
    makefile_variables,
    nearshore_args,
    parse_copy,
    parse_dockerfile,
    parse_nearshore,
    pip_extras,
    pod_spec,
    secret_names,
)
from tests.edge_fixtures import start_pacer

DOCKER = DEPLOY / "docker"
COMPOSE = DEPLOY / "compose" / "lagos.yml"
K8S = DEPLOY / "k8s"
IMAGES = {"edge": {"edge"}, "region-cpu": {"region"}, "region-gpu": {"region", "gpu"}}
OVERLAYS = ["overlays/lagos-edge", "overlays/london-region-cpu", "overlays/london-region-gpu"]
KUSTOMIZATIONS = ["base/edge", "base/region", *OVERLAYS]
HEAVY = ("torch", "cupy", "llama_cpp")
PRESTOP_S = 5


def dockerfile(image: str) -> Dockerfile:
    return parse_dockerfile(DOCKER / f"{image}.Dockerfile")


def load_any(path: Path) -> EdgeConfig | RegionConfig:
    return load_config(str(path), EdgeConfig if "edge" in path.name else RegionConfig)


def check(config: EdgeConfig | RegionConfig) -> None:
    """The process's own start-up checks, with the files that only exist in a container left out."""
    replace = msgspec.structs.replace
    if isinstance(config, EdgeConfig):
        upstream = replace(config.upstream, ca="", client_cert="", client_key="")
        # the data folder is the container's volume: here, the same file names in a folder that exists
        here = Path(tempfile.gettempdir())
        files = {
            "keys_db": str(here / Path(config.keys_db).name),
            "ledger_db": str(here / Path(config.ledger_db).name),
        }
        tls = replace(config.tls, cert="", key="")
        check_edge_config(replace(config, tls=tls, upstream=upstream, **files))
    else:
        check_region_config(
            replace(config, server=replace(config.server, tls_cert="", tls_key="", client_ca=""))
        )


def region_drain_s() -> float:
    """How long `nearshore region` lets in-flight streams finish after SIGTERM: the shutdown_timeout of
    the AppRunner in regional/node.py, or aiohttp's default when it passes none."""
    tree = ast.parse((ROOT / "regional" / "node.py").read_text())
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(("AppRunner", "ApiRunner"))
    ]
    assert len(calls) == 1, "run_region builds one runner (ApiRunner is aiohttp's AppRunner)"
    for keyword in calls[0].keywords:
        if keyword.arg == "shutdown_timeout":
            return float(ast.literal_eval(keyword.value))
    return float(inspect.signature(web.BaseRunner.__init__).parameters["shutdown_timeout"].default)


# --- Dockerfiles ------------------------------------------------------------------------------------


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile_parses_and_copies_only_what_exists(image: str) -> None:
    parsed = dockerfile(image)
    ignore = (DOCKER / f"{image}.Dockerfile.dockerignore").read_text().splitlines()
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "**" in ignore, "the context is the repository root: everything not named stays out (.venv, .git)"
    names = [s.name for s in parsed.stages]
    copies = [parse_copy(i) for stage in parsed.stages for i in stage.all("COPY")]
    assert copies
    for copy in copies:
        if copy.from_stage:
            assert copy.from_stage in names[: names.index(parsed.final.name)], copy
            continue
        for source in copy.sources:
            assert (ROOT / source).exists(), f"{image}: COPY {source}: not in the repository"
            assert any(source == k or source.startswith(k + "/") for k in kept), (
                f"{image}: COPY {source} is excluded by its .dockerignore"
            )
    # Every package the setuptools config finds is in the image (the CLI's parser imports them all), and
    # configs/ beside them (geo/places.py reads configs/cities.toml from the source tree).
    copied = {s.rstrip("/") for c in copies for s in c.sources}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert {p.rstrip("*") for p in packages["find"]["include"]} <= copied
    assert "configs" in copied


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile_installs_real_extras_editable(image: str) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    runs = [i.text for i in dockerfile(image).final.all("RUN")]
    installed = [e for run in runs for e in pip_extras(run)]
    assert installed == [IMAGES[image]], f"{image} installs {installed}"
    assert installed[0] <= set(extras), f"unknown extras: {installed[0] - set(extras)}"
    assert any("pip install" in r and "-e '.[" in r for r in runs), "editable: configs/ stays beside geo/"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile_pins_match_the_makefile(image: str) -> None:
    make, args = makefile_variables(), dockerfile(image).args()
    assert args["MINILM_VERSION"] == make["MINILM_VERSION"]
    if image == "edge":
        assert "LLAMA_CPP_VERSION" not in args
        return
    assert args["LLAMA_CPP_VERSION"] == make["LLAMA_CPP_VERSION"]
    assert args["LLAMA_CMAKE_ARGS"] == make["LLAMA_CMAKE_ARGS"], "the Makefile's portable CPU flags"
    assert "-DGGML_NATIVE=OFF" in args["LLAMA_CMAKE_ARGS"]
    builder = dockerfile(image).stages[0]
    assert builder.name == "llama-wheel" and any("pip wheel" in r.text for r in builder.all("RUN"))
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"llama-cpp-python=={make['LLAMA_CPP_VERSION']}" in pins["region"]


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_image_runs_a_real_command_as_non_root_with_a_healthcheck(image: str) -> None:
    final = dockerfile(image).final
    user = final.last("USER")
    assert user is not None and user.text not in ("root", "0")
    assert final.last("STOPSIGNAL").text == "SIGTERM"
    entrypoint, cmd = final.last("ENTRYPOINT").exec_form(), final.last("CMD").exec_form()
    assert entrypoint and cmd, "exec form: nearshore is PID 1 and receives SIGTERM itself"
    args = parse_nearshore(nearshore_args(entrypoint + cmd))
    assert args.command == ("edge" if image == "edge" else "region")
    # The config named by --config is a file of this repository copied to that path, and it loads.
    copied = {parse_copy(c).destination: parse_copy(c).sources[0] for c in final.all("COPY")}
    config = load_any(ROOT / copied[args.config])
    check(config)
    exposed = {int(p) for e in final.all("EXPOSE") for p in e.text.split()}
    assert config.server.port in exposed
    probe = final.last("HEALTHCHECK").text
    assert re.search(rf"://127\.0\.0\.1:{config.server.port}/health'", probe), probe
    if image != "edge":
        assert config.engine.kind == ("gpu" if image == "region-gpu" else "llama.cpp")
        assert config.model.cache_dir == "/opt/nearshore/models"
        assert any("resolve_model_path('', '/opt/nearshore/models')" in r.text for r in final.all("RUN"))
    if image == "region-gpu":
        assert re.match(r"nvidia/cuda:12\.", dockerfile(image).global_args["CUDA_IMAGE"])
        assert all(s.base == "${CUDA_IMAGE}" for s in dockerfile(image).stages)


def test_edge_import_graph_has_no_torch_cupy_or_llama_cpp() -> None:
    code = "import edge.node, edge.app, cli; cli.build_parser()"
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    imported = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
    assert "edge" in imported and "aiohttp" in imported
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


@pytest.mark.slow
def test_edge_serves_with_only_the_edge_images_packages(tmp_path: Path, postgres: Postgres) -> None:
    """The Lagos overlay's edge config, on this machine's paths, served by `nearshore edge` while every
    package the edge image would not have (torch, CuPy, llama.cpp, matplotlib, ...) is unimportable: a
    key is checked (the city's PostgreSQL key table, as in the overlay), a stream relayed from a stand-in
    region, and a paraphrase of it answered from the semantic cache (the embedder on ONNX Runtime)."""
    # Its first byte takes 150 ms, as a far region's would: the semantic lookup (an embedding) wins the race.
    pacer = start_pacer(tmp_path, tokens=6, interval_ms=150)
    config = tomllib.loads((K8S / "overlays" / "lagos-edge" / "edge.toml").read_text())
    port = free_port()
    config.update(ledger_db=str(tmp_path / "ledger.sqlite3"))
    config["keys"]["postgres_url"] = config["ledger"]["postgres_url"] = postgres.url
    config["server"]["host"] = "127.0.0.1"
    config["tls"] = {"enabled": False}
    config["upstream"] = {}
    config["limits"] = {"backend": "memory"}
    config["metrics"]["port"] = 0
    config["cache"].update(folder=str(tmp_path / "cache"), store_truncated=True)  # the pacer's are
    config["regions"] = [{"name": "london", "city": "london", "url": pacer.url}]
    (tmp_path / "edge.toml").write_text(dumps(config))
    key = asyncio.run(postgres.create_key("acme"))
    report = tmp_path / "attempts.json"
    argv = [sys.executable, str(ROOT / "tests" / "edge_image_probe.py"), str(report)]
    edge = ManagedProcess(
        "edge",
        [*argv, "edge", "--config", str(tmp_path / "edge.toml"), "--port", str(port)],
        tmp_path / "edge.log",
    )
    url = f"http://127.0.0.1:{port}/v1/chat/completions"

    def ask(question: str, key: str | None, extra: dict[str, str] | None = None) -> tuple[str, list[bytes]]:
        body = {"model": "gemma-3-270m", "stream": True, "temperature": 0}
        body["messages"] = [{"role": "user", "content": question}]
        headers = {"Content-Type": "application/json", **(extra or {})}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.headers["x-nearshore-cache"], [line.strip() for line in response if line.strip()]

    try:
        with edge:
            edge.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=60)
            with pytest.raises(urllib.error.HTTPError) as refused:
                ask("Hello?", None)
            assert refused.value.code == 401
            assert json.loads(refused.value.read())["error"]["code"] == "invalid_api_key"
            cache, lines = ask("Is it safe to drink tap water in London?", key)
            assert cache == "MISS" and lines[-1] == b"data: [DONE]" and len(lines) > 6, lines
            for _ in range(100):  # stored off the request's path
                no_store = {"Cache-Control": "no-store"}
                if ask("Is it safe to drink tap water in London?", key, no_store)[0] == "HIT":
                    break
                time.sleep(0.05)
            cache, lines = ask("Is it safe to drink the tap water in London, please?", key)
            assert cache == "SEMANTIC" and lines[-1] == b"data: [DONE]", (cache, edge.log_tail())
    finally:
        pacer.process.stop()
    found = json.loads(report.read_text())
    installed = {m for m in HEAVY if importlib.util.find_spec(m)}
    assert {"torch", "llama_cpp"} <= installed <= set(found["blocked"]), "installed here, blocked in the edge"
    assert not set(found["attempts"]) & set(HEAVY), found["attempts"]


# --- compose ----------------------------------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_lagos_topology_mounts_what_exists() -> None:
    spec, here = compose(), COMPOSE.parent
    services = spec["services"]
    regions = [n for n, s in services.items() if "region" in s.get("build", {}).get("dockerfile", "")]
    assert {"edge", "redis", "prometheus", "grafana"} <= set(services)
    assert len(regions) >= 2
    for name, service in services.items():
        if build := service.get("build"):
            assert (here / build["context"] / build["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.partition(":")[0]
            if source.startswith("."):
                assert (here / source).exists(), f"{name}: {source} is not in the repository"
        for port in service.get("ports", []):
            host, container = (int(p) for p in port.split(":"))
            assert 0 < host < 65536 and 0 < container < 65536
    assert set(spec["secrets"]) == {s for v in services.values() for s in v.get("secrets", [])}
    mounted = {
        v.partition(":")[2].partition(":")[0]: v.partition(":")[0] for v in services["prometheus"]["volumes"]
    }
    assert mounted["/etc/prometheus/prometheus.yml"] == "../../configs/prometheus/compose-lagos.yml"
    assert any("configs/grafana" in v for v in services["grafana"]["volumes"])


def test_compose_configs_load_and_name_the_compose_services() -> None:
    services = compose()["services"]
    args = parse_nearshore(services["edge"]["command"])  # after the image's ENTRYPOINT ["nearshore"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["edge"]["volumes"]}
    edge = load_config(str(COMPOSE.parent / mounts[args.config]), EdgeConfig)
    assert urlparse(edge.limits.redis_url).hostname == "redis" and edge.limits.backend == "redis"
    assert "8443:8443" in services["edge"]["ports"] and edge.server.port == 8443
    assert {urlparse(u).hostname for r in edge.regions for u in r.urls()} <= set(services)
    secrets = {f"/run/secrets/{s}" for s in services["edge"]["secrets"]}
    assert {edge.tls.cert, edge.tls.key} <= secrets
    # Fleet mode: keys and the bill in the compose PostgreSQL, whose password is a secret for the server and
    # the edge's PGPASSWORD (from the env file make-secrets.sh writes), never the config.
    assert edge.keys.backend == "postgres" and edge.ledger.postgres_url == edge.keys.postgres_url
    assert (
        urlparse(edge.keys.postgres_url).hostname == "postgres"
        and "postgres" in services["edge"]["depends_on"]
    )
    server = services["postgres"]
    password = server["environment"]["POSTGRES_PASSWORD_FILE"]
    assert password == f"/run/secrets/{server['secrets'][0]}"
    assert services["edge"]["env_file"] == ["./secrets/edge.env"]
    check(edge)
    for name, service in services.items():
        if "region" in service.get("build", {}).get("dockerfile", ""):
            region = load_config(str(COMPOSE.parent / service["volumes"][0].split(":")[0]), RegionConfig)
            assert region.name == name and region.server.port == 8100 and region.server.host == "0.0.0.0"
            check(region)
            grace = int(service["stop_grace_period"].rstrip("s"))
            assert grace >= region_drain_s()
    assert int(services["edge"]["stop_grace_period"].rstrip("s")) >= edge.server.shutdown_timeout_s


def test_make_secrets_makes_every_secret_compose_mounts(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["sh", str(COMPOSE.parent / "make-secrets.sh"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    files = {name: tmp_path / Path(s["file"]).name for name, s in compose()["secrets"].items()}
    assert all(f.is_file() for f in files.values()), files
    ssl.create_default_context().load_cert_chain(files["edge_tls_cert"], files["edge_tls_key"])
    env = dict(line.split("=", 1) for line in (tmp_path / "edge.env").read_text().splitlines())
    assert env["PGPASSWORD"] == files["postgres_password"].read_text() and len(env["PGPASSWORD"]) >= 24
    assert len(env["NEARSHORE_ADMIN_TOKEN"]) >= MIN_TOKEN_CHARS
    assert (tmp_path / "edge.env").stat().st_mode & 0o077 == 0  # the edge's credentials: owner only
    assert all(Path(s["file"]).parent == Path("secrets") for s in compose()["secrets"].values())


# --- Kubernetes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_kustomization_renders_and_validates_against_the_schemas(folder: str) -> None:
    docs = kustomize(K8S / folder)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_lagos_edge_overlay() -> None:
    docs = kustomize(K8S / "overlays" / "lagos-edge")
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"nearshore-lagos"}
    (deployment,) = find(docs, "Deployment", "edge")
    (hpa,) = find(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "edge"}
    assert hpa["spec"]["minReplicas"] >= 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for kind in ("PodDisruptionBudget", "Service"):
        selectors = [d["spec"]["selector"] for d in find(docs, kind) if "nearshore-edge" in json.dumps(d)]
        assert selectors and all(
            set(s.get("matchLabels", s).items()) <= set(labels.items()) for s in selectors
        )
    spec = pod_spec(deployment)
    assert secret_names(spec) == {"edge-tls", "edge-upstream-mtls", "edge-postgres", "edge-admin"}
    (container,) = spec["containers"]
    assert container["image"].startswith("registry.example.com/nearshore/edge:")
    args = parse_nearshore(container["args"])
    (config_map,) = find(docs, "ConfigMap")
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == args.config)
    edge = msgspec.toml.decode(config_map["data"][mount["subPath"]], type=EdgeConfig)
    assert edge.name == "lagos" and edge.server.host == "0.0.0.0"
    # Limits in the Redis of this overlay, reached by its Service's name.
    assert edge.limits.backend == "redis"
    assert find(docs, "Service", urlparse(edge.limits.redis_url).hostname) and find(
        docs, "Deployment", "redis"
    )
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    for path in (edge.tls.cert, edge.tls.key, edge.upstream.ca, edge.upstream.client_cert):
        assert str(Path(path).parent) in mounted, path
    stop = spec["terminationGracePeriodSeconds"]
    assert stop >= edge.server.shutdown_timeout_s + PRESTOP_S
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(PRESTOP_S)]
    # Keys and the bill in the city's PostgreSQL (this overlay's StatefulSet, by its Service's name), its
    # password from a Secret, never the config: a key change needs no rollout, so no keys file is copied.
    assert "initContainers" not in spec
    assert edge.keys.backend == "postgres" and edge.ledger.postgres_url == edge.keys.postgres_url
    host = urlparse(edge.keys.postgres_url).hostname
    assert find(docs, "Service", host) and find(docs, "StatefulSet", "postgres")
    env = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert env == {"PGPASSWORD": "edge-postgres", "NEARSHORE_ADMIN_TOKEN": "edge-admin"}
    (server,) = pod_spec(find(docs, "StatefulSet", "postgres")[0])["containers"]
    passwords = [e for e in server["env"] if e["name"] == "POSTGRES_PASSWORD"]
    assert passwords[0]["valueFrom"]["secretKeyRef"]["name"] == "edge-postgres"
    check(edge)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_london_region_overlay(kind: str) -> None:
    docs = kustomize(K8S / "overlays" / f"london-region-{kind}")
    (statefulset,) = find(docs, "StatefulSet", "region")
    spec = pod_spec(statefulset)
    (container,) = spec["containers"]
    assert container["image"].startswith(f"registry.example.com/nearshore/region-{kind}:")
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    args = parse_nearshore(container["args"])
    (config_map,) = find(docs, "ConfigMap")
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == args.config)
    region = msgspec.toml.decode(config_map["data"][mount["subPath"]], type=RegionConfig)
    assert region.name == "london" and region.server.host == "0.0.0.0"
    assert region.engine.kind == ("gpu" if kind == "gpu" else "llama.cpp")
    check(region)
    scheme = "HTTPS" if region.server.tls_cert else "HTTP"
    assert container["readinessProbe"]["httpGet"]["scheme"] == scheme
    assert {p["containerPort"] for p in container["ports"]} == {region.server.port}
    gpus = {k: v for k, v in container["resources"]["limits"].items() if k == "nvidia.com/gpu"}
    assert gpus == ({"nvidia.com/gpu": 1} if kind == "gpu" else {})
    if kind == "cpu":
        assert region.engine.n_threads == int(container["resources"]["requests"]["cpu"])
    # The kubelet's SIGKILL comes after the node's own drain, never during it.
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(PRESTOP_S)]
    assert spec["terminationGracePeriodSeconds"] >= region_drain_s() + PRESTOP_S
    assert secret_names(spec) == {"region-tls"}
    (service,) = find(docs, "Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"


def test_every_secret_the_manifests_use_is_made_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Deployment") :]
    made = set(re.findall(r"kubectl[^\n]*create secret (?:generic|tls) ([a-z0-9-]+)", section))
    used = set()
    for folder in KUSTOMIZATIONS:
        for doc in kustomize(K8S / folder):
            if doc["kind"] in ("Deployment", "StatefulSet"):
                used |= secret_names(pod_spec(doc))
    assert used and used <= made, f"not made in the README: {sorted(used - made)}"


# --- the drain that the grace periods rely on -----------------------------------------------------


@pytest.mark.slow
def test_region_finishes_an_inflight_stream_after_sigterm(tmp_path: Path) -> None:
    """`nearshore region` on SIGTERM: it stops accepting, the stream in flight runs to its end, it exits 0."""
    node = start_region(tmp_path, engine={"max_sequences": 2, "kv_cache_tokens": 2048, "context_window": 512})
    body = {
        "model": "gemma-3-270m",
        "prompt": "Once upon a time",
        "max_tokens": 120,
        "temperature": 0,
        "stream": True,
    }
    request = urllib.request.Request(
        node.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    events: list[str] = []
    with urllib.request.urlopen(request, timeout=120) as response:
        first = response.readline()
        assert first.startswith(b"data: ")
        started = time.monotonic()
        node.process.proc.send_signal(15)  # SIGTERM to the node alone, as the kubelet sends it
        refused = threading.Event()

        def try_new_connection() -> None:
            try:
                urllib.request.urlopen(node.url + "/health", timeout=2)
            except OSError:
                refused.set()

        time.sleep(0.5)
        try_new_connection()
        events = [line.decode().strip() for line in response if line.strip()]
    assert events[-1] == "data: [DONE]", node.process.log_tail()
    assert refused.is_set(), "a draining node accepts no new connection"
    assert node.process.proc.wait(timeout=30) == 0
    assert len(events) >= 2 and time.monotonic() - started < region_drain_s()
