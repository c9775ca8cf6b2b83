"""TLS: the dev certificate, the cluster CA, and regional nodes that serve only edges.

Every handshake here is real, on loopback: an in-process aiohttp server for the dev certificate, real
``nearshore region`` processes for mutual TLS and the shared secret.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import re
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cli import ca as ca_cli
from harness.procs import ManagedProcess, free_port
from nearshore import tls
from nearshore.children import nearshore_argv
from regional.config import RegionConfig
from regional.node import check_config, server_ssl_context
from tests.conftest import MODEL, Node, start_region, write_region_config

SECRET = "correct-horse-battery-staple"
SMALL_ENGINE = {"max_sequences": 2, "kv_cache_tokens": 2048, "context_window": 512}


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _usages(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- the development certificate ---------------------------------------------------------------------


def test_dev_certificate_is_made_once_then_reused(tmp_path):
    cert, key = tls.ensure_dev_certificate(tmp_path / "dev")
    assert _mode(key) == 0o600
    first = cert.read_bytes(), key.read_bytes()
    assert tls.ensure_dev_certificate(tmp_path / "dev") == (cert, key)
    assert (cert.read_bytes(), key.read_bytes()) == first

    made = _cert(cert)
    sans = made.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    lifetime = made.not_valid_after_utc - made.not_valid_before_utc
    assert 364 <= lifetime.days <= 366


def test_dev_certificate_is_remade_when_unreadable_or_expired(tmp_path, monkeypatch):
    cert, key = tls.ensure_dev_certificate(tmp_path)
    original = cert.read_bytes()

    cert.write_text("not a certificate")
    tls.ensure_dev_certificate(tmp_path)
    remade = cert.read_bytes()
    assert remade != original and _cert(cert) and _mode(key) == 0o600

    real_now = tls._now()
    monkeypatch.setattr(tls, "_now", lambda: real_now + tls.dt.timedelta(days=400))
    tls.ensure_dev_certificate(tmp_path)
    assert cert.read_bytes() != remade


def test_dev_certificate_callers_at_once_get_one_matching_pair(tmp_path):
    folder = tmp_path / "dev"
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: tls.ensure_dev_certificate(folder), range(8)))
    assert len(set(results)) == 1
    cert, key = results[0]
    tls.server_context(cert, key)  # raises if the key does not belong to the certificate
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


@contextlib.asynccontextmanager
async def _tls_server(context: ssl.SSLContext):
    async def hello(request: web.Request) -> web.Response:
        ssl_object = request.transport.get_extra_info("ssl_object")
        peer = tls.peer_certificate_name(request.transport)
        return web.json_response({"version": ssl_object.version(), "peer": peer})

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def test_dev_certificate_serves_a_verified_handshake(tmp_path):
    cert, key = tls.ensure_dev_certificate(tmp_path)
    async with _tls_server(tls.server_context(cert, key)) as port:
        trusting = aiohttp.TCPConnector(ssl=tls.client_context(ca=cert))
        async with aiohttp.ClientSession(connector=trusting) as s:
            for host in ("127.0.0.1", "localhost"):
                async with s.get(f"https://{host}:{port}/") as r:
                    body = await r.json()
                assert r.status == 200 and body["version"] in ("TLSv1.2", "TLSv1.3"), body
                assert body["peer"] is None

        # The system's trust store does not know the dev certificate: verification is on.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as s:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await s.get(f"https://127.0.0.1:{port}/")


# --- the cluster CA ----------------------------------------------------------------------------------


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca_dir = root / "ca"
        self.certs = root / "certs"
        self.ca, self.ca_key = tls.create_cluster_ca(self.ca_dir)
        self.node = tls.issue_certificate(self.ca_dir, "region-test", self.certs, server=True)
        self.edge = tls.issue_certificate(self.ca_dir, "edge-test", self.certs, client=True)
        # A certificate from the right CA but for servers only, and one from a CA the node does not know.
        self.server_only = tls.issue_certificate(self.ca_dir, "not-a-client", self.certs, server=True)
        rogue_dir = root / "rogue-ca"
        tls.create_cluster_ca(rogue_dir, "Some other CA")
        self.rogue = tls.issue_certificate(rogue_dir, "edge-rogue", self.certs, client=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def test_issued_certificates_carry_name_usages_and_hosts(pki: Pki):
    ca = _cert(pki.ca)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    assert _mode(pki.ca_key) == 0o600

    node, edge = _cert(pki.node[0]), _cert(pki.edge[0])
    assert node.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "region-test"
    assert node.issuer == ca.subject and edge.issuer == ca.subject
    node.verify_directly_issued_by(ca)
    assert _usages(node) == {ExtendedKeyUsageOID.SERVER_AUTH}
    assert _usages(edge) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    sans = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert _mode(pki.node[1]) == 0o600 and _mode(pki.edge[1]) == 0o600


def test_cluster_ca_is_not_replaced_without_force(tmp_path):
    cert, _ = tls.create_cluster_ca(tmp_path)
    first = cert.read_bytes()
    with pytest.raises(FileExistsError):
        tls.create_cluster_ca(tmp_path)
    assert cert.read_bytes() == first
    tls.create_cluster_ca(tmp_path, force=True)
    assert cert.read_bytes() != first


def test_issue_needs_a_ca_a_use_and_a_safe_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="no cluster CA"):
        tls.issue_certificate(tmp_path / "nowhere", "edge", tmp_path, client=True)
    tls.create_cluster_ca(tmp_path / "ca")
    with pytest.raises(ValueError, match="client, server or both"):
        tls.issue_certificate(tmp_path / "ca", "edge", tmp_path)
    with pytest.raises(ValueError, match="certificate name"):
        tls.issue_certificate(tmp_path / "ca", "../edge", tmp_path, client=True)


# --- a regional node that serves only edges ----------------------------------------------------------


def start_tls_region(folder: Path, ca: Path, **server: object) -> Node:
    port = free_port()
    config = write_region_config(folder / "region.toml", port, {"server": server, "engine": SMALL_ENGINE})
    process = ManagedProcess(
        "region", nearshore_argv("region", "--config", str(config)), folder / "region.log"
    )
    process.start()
    url = f"https://127.0.0.1:{port}"
    try:
        process.wait_http(url + "/health/ready", timeout_s=180, context=tls.client_context(ca=ca))
    except Exception:
        process.stop()
        raise
    return Node(url, process)


@pytest.fixture(scope="module")
def mtls_node(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = start_tls_region(
        tmp_path_factory.mktemp("mtls-region"),
        pki.ca,
        tls_cert=str(pki.node[0]),
        tls_key=str(pki.node[1]),
        client_ca=str(pki.ca),
    )
    yield node
    node.process.stop()


def _session(pki: Pki, client: tuple[Path, Path] | None = None) -> aiohttp.ClientSession:
    context = tls.client_context(
        ca=pki.ca, cert=client[0] if client else None, key=client[1] if client else None
    )
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))


def _assert_refused(status: int, body: dict) -> None:
    assert status == 401, body
    error = body["error"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert "Only Nearshore edges" in error["message"]


@pytest.mark.slow
async def test_mtls_node_serves_an_edge_with_a_cluster_certificate(mtls_node: Node, pki: Pki):
    async with _session(pki, pki.edge) as s:
        async with s.get(mtls_node.url + "/v1/models") as r:
            assert r.status == 200
            assert MODEL in [card["id"] for card in (await r.json())["data"]]
        payload = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        async with s.post(mtls_node.url + "/v1/chat/completions", json=payload) as r:
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] >= 1


@pytest.mark.slow
async def test_mtls_node_refuses_a_client_without_a_certificate(mtls_node: Node, pki: Pki):
    async with _session(pki) as s:
        async with s.get(mtls_node.url + "/v1/models") as r:
            _assert_refused(r.status, await r.json())
            assert r.headers["x-request-id"]
        payload = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
        async with s.post(mtls_node.url + "/v1/chat/completions", json=payload) as r:
            _assert_refused(r.status, await r.json())
        async with s.get(mtls_node.url + "/nowhere") as r:
            _assert_refused(r.status, await r.json())  # no hint of which paths exist
        # Probes and scrapes stay open.
        for path in ("/health", "/health/ready", "/metrics"):
            async with s.get(mtls_node.url + path) as r:
                assert r.status == 200, path


@pytest.mark.slow
@pytest.mark.parametrize("who", ["rogue", "server_only"])
async def test_mtls_node_refuses_certificates_that_do_not_verify(mtls_node: Node, pki: Pki, who: str):
    """Another CA's certificate, or the cluster's without clientAuth, fails the handshake itself."""
    async with _session(pki, getattr(pki, who)) as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(mtls_node.url + "/v1/models") as r:
                await r.read()
    async with _session(pki, pki.edge) as s, s.get(mtls_node.url + "/v1/models") as r:
        assert r.status == 200  # the node serves on


@pytest.mark.slow
async def test_tls_node_is_not_reachable_over_plain_http(mtls_node: Node):
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(mtls_node.url.replace("https://", "http://") + "/health") as r:
                await r.read()


@pytest.fixture(scope="module")
def secret_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = start_region(
        tmp_path_factory.mktemp("secret-region"), server={"shared_secret": SECRET}, engine=SMALL_ENGINE
    )
    yield node
    node.process.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"x-nearshore-edge-secret": "wrong"}, 401), ({"x-nearshore-edge-secret": SECRET}, 200)],
)
async def test_shared_secret_node_serves_only_the_right_secret(secret_node: Node, headers, status):
    async with aiohttp.ClientSession() as s, s.get(secret_node.url + "/v1/models", headers=headers) as r:
        body = await r.json()
        if status == 401:
            _assert_refused(r.status, body)
        else:
            assert r.status == 200 and body["object"] == "list"


@pytest.mark.slow
async def test_shared_secret_node_keeps_health_open(secret_node: Node):
    async with aiohttp.ClientSession() as s:
        for path in ("/health", "/health/ready", "/metrics"):
            async with s.get(secret_node.url + path) as r:
                assert r.status == 200, path


# --- config ------------------------------------------------------------------------------------------


def _config(**server: object) -> RegionConfig:
    return msgspec.convert({"server": server}, RegionConfig)


def test_defaults_stay_plain_http():
    config = _config()
    check_config(config)
    assert server_ssl_context(config) is None


@pytest.mark.parametrize(
    ("server", "key"),
    [
        ({"client_ca": "{ca}"}, "server.client_ca"),
        ({"tls_cert": "{cert}"}, "server.tls_key"),
        ({"tls_key": "{key}"}, "server.tls_cert"),
        ({"tls_cert": "{dir}/missing.pem", "tls_key": "{key}"}, "server.tls_cert: file not found"),
        ({"tls_cert": "{cert}", "tls_key": "{dir}/missing.pem"}, "server.tls_key: file not found"),
        (
            {"tls_cert": "{cert}", "tls_key": "{key}", "client_ca": "{dir}/missing.pem"},
            "server.client_ca: file not found",
        ),
        ({"shared_secret": "short"}, "server.shared_secret"),
    ],
)
def test_config_errors_name_the_key(pki: Pki, server: dict[str, str], key: str):
    values = {"ca": pki.ca, "cert": pki.node[0], "key": pki.node[1], "dir": pki.certs}
    config = _config(**{k: v.format(**values) for k, v in server.items()})
    with pytest.raises(ValueError, match=re.escape(key)):
        check_config(config)


def test_a_file_that_is_not_a_certificate_is_a_config_error(pki: Pki, tmp_path):
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate\n")
    config = _config(tls_cert=str(bogus), tls_key=str(pki.node[1]))
    check_config(config)  # the file exists
    with pytest.raises(ValueError, match=re.escape("server.tls_cert/")):
        server_ssl_context(config)


@pytest.mark.slow
def test_region_command_reports_a_missing_certificate(tmp_path):
    config = write_region_config(
        tmp_path / "region.toml", 0, {"server": {"tls_cert": "/no/such.pem", "tls_key": "/no/such-key.pem"}}
    )
    done = subprocess.run(
        [sys.executable, "-m", "nearshore", "region", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "server.tls_cert: file not found: /no/such.pem" in done.stderr and str(config) in done.stderr


# --- the CLI -----------------------------------------------------------------------------------------


def _ca(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    ca_cli.add_arguments(parser)
    return ca_cli.run(parser.parse_args(list(argv)))


def test_ca_cli_init_and_issue(tmp_path, capsys):
    ca_dir, out = tmp_path / "ca", tmp_path / "certs"
    assert _ca("init", "--dir", str(ca_dir)) == 0
    assert capsys.readouterr().out.split() == [str(ca_dir / "ca.pem"), str(ca_dir / "ca-key.pem")]

    assert _ca("init", "--dir", str(ca_dir)) == 2
    assert "already exists" in capsys.readouterr().err
    assert _ca("init", "--dir", str(ca_dir), "--force") == 0
    capsys.readouterr()

    argv = ["issue", "london", "--dir", str(ca_dir), "--out", str(out), "--host", "london.internal"]
    assert _ca(*argv, "--host", "10.0.0.5", "--server", "--client") == 0
    assert capsys.readouterr().out.split() == [str(out / "london.pem"), str(out / "london-key.pem")]
    cert = _cert(out / "london.pem")
    assert _usages(cert) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["london.internal"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]

    assert _ca("issue", "edge", "--dir", str(ca_dir), "--out", str(out)) == 2  # no --client/--server
    assert "client, server or both" in capsys.readouterr().err


def test_ca_cli_issue_without_a_ca(tmp_path, capsys):
    assert _ca("issue", "edge", "--dir", str(tmp_path / "none"), "--out", str(tmp_path), "--client") == 2
    assert "no cluster CA" in capsys.readouterr().err
