"""TLS for Nearshore: a self-signed development certificate, a cluster CA that signs edge and node
certificates, and the ``ssl`` contexts that use them.

Keys and certificates are made with ``cryptography`` (EC P-256); contexts are the standard library's.
Files are PEM, written atomically (temporary file + rename), keys with mode 0600.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import re
import ssl
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

try:
    import fcntl
except ImportError:  # pragma: no cover - platforms without flock
    fcntl = None  # type: ignore[assignment]

DEV_CERT = "dev-cert.pem"
DEV_KEY = "dev-key.pem"
CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"

DEV_DAYS = 365
CA_DAYS = 10 * 365
LEAF_DAYS = 365
# A certificate this close to its end is treated as expired, so a process never starts on one that
# lapses while it runs for the day.
RENEW_MARGIN = dt.timedelta(days=1)
# Clocks of machines in a cluster differ a little; certificates start being valid a bit in the past.
BACKDATE = dt.timedelta(minutes=5)
DEV_HOSTS = ("localhost", "127.0.0.1", "::1")

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --- the development certificate ---------------------------------------------------------------------


def ensure_dev_certificate(folder: Path) -> tuple[Path, Path]:
    """The self-signed development certificate and key in ``folder``, made on first use.

    Later calls return the same pair; a pair that is expired, unreadable or mismatched is made anew.
    A lock file serialises processes that start at once, and each file is replaced atomically, so a
    reader never sees half a file.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / DEV_CERT, folder / DEV_KEY
    with _locked(folder / ".dev-cert.lock"):
        if _usable_pair(cert_path, key_path):
            return cert_path, key_path
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name("Nearshore development certificate")
        cert = (
            _builder(name, name, key.public_key(), DEV_DAYS)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_leaf_key_usage(), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(_subject_alt_names(DEV_HOSTS), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        _write_pair(cert_path, cert, key_path, key)
    return cert_path, key_path


def _usable_pair(cert_path: Path, key_path: Path) -> bool:
    """Both files load, the key belongs to the certificate, and it is valid for another day."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    same_key = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    now = _now()
    return same_key and cert.not_valid_before_utc <= now and cert.not_valid_after_utc > now + RENEW_MARGIN


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


# --- the cluster CA and the certificates it issues ---------------------------------------------------


def create_cluster_ca(
    folder: Path, name: str = "Nearshore cluster CA", *, force: bool = False
) -> tuple[Path, Path]:
    """A new CA (``ca.pem``, ``ca-key.pem``) that signs the cluster's edge and node certificates.

    Refuses (FileExistsError) to replace an existing CA unless ``force``: every certificate it issued
    would stop being trusted.
    """
    folder = Path(folder)
    cert_path, key_path = folder / CA_CERT, folder / CA_KEY
    if not force and (cert_path.exists() or key_path.exists()):
        raise FileExistsError(f"a cluster CA already exists in {folder} (use force to replace it)")
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(name)
    cert = (
        _builder(subject, subject, key.public_key(), CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    _write_pair(cert_path, cert, key_path, key)
    return cert_path, key_path


def issue_certificate(
    ca_folder: Path,
    name: str,
    out_folder: Path,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    client: bool = False,
    server: bool = False,
) -> tuple[Path, Path]:
    """A leaf certificate signed by the CA in ``ca_folder``: ``out_folder/NAME.pem`` and ``NAME-key.pem``.

    CN is ``name``; ``hosts`` become SANs (IP addresses as IPAddress SANs); ``client`` and ``server``
    choose the extended key usages (clientAuth, serverAuth), at least one of them.
    """
    if not _SAFE_NAME.match(name):
        raise ValueError(f"certificate name {name!r}: use letters, digits, '.', '_' or '-' (up to 64)")
    if not (client or server):
        raise ValueError("a certificate needs a use: client, server or both")
    ca_folder, out_folder = Path(ca_folder), Path(out_folder)
    try:
        ca_cert = x509.load_pem_x509_certificate((ca_folder / CA_CERT).read_bytes())
        ca_key = serialization.load_pem_private_key((ca_folder / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"no cluster CA in {ca_folder}: {exc.filename} is missing") from exc
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_folder / CA_KEY}: expected an EC private key")
    usages: list[x509.ObjectIdentifier] = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(_name(name), ca_cert.subject, key.public_key(), LEAF_DAYS)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)
    )
    if hosts:
        builder = builder.add_extension(_subject_alt_names(hosts), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out_folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out_folder / f"{name}.pem", out_folder / f"{name}-key.pem"
    _write_pair(cert_path, cert, key_path, key)
    return cert_path, key_path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int
) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _leaf_key_usage() -> x509.KeyUsage:
    # ECDHE key exchange: an EC leaf key only signs the handshake.
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _subject_alt_names(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _write_pair(
    cert_path: Path, cert: x509.Certificate, key_path: Path, key: ec.EllipticCurvePrivateKey
) -> None:
    """Key first, then certificate: a reader that finds a new certificate finds its key too."""
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_atomic(key_path, key_pem, 0o600)
    _write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    # mkstemp creates the file with mode 0600, so a key is never readable by others, even briefly.
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


# --- ssl contexts --------------------------------------------------------------------------------------


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server context, TLS 1.2 or newer.

    With ``client_ca``, clients are asked for a certificate signed by that CA, but not required to send
    one (``CERT_OPTIONAL``): a client without a certificate completes the handshake and the HTTP layer
    answers it with a readable 401, instead of a handshake failure the client cannot explain. A client
    that sends a certificate that does not verify (another CA, expired, no clientAuth usage) still fails
    the handshake. So ``peer_certificate_name`` sees only verified certificates, and the HTTP layer must
    refuse requests without one.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    if client_ca is not None:
        context.load_verify_locations(cafile=str(client_ca))
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def client_context(
    ca: Path | None = None, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    """A client context, TLS 1.2 or newer, that verifies the server's certificate and host name against
    ``ca`` (or the system's trust store when None) and presents ``cert``/``key`` when given."""
    context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        context.load_cert_chain(str(cert), str(key) if key is not None else None)
    return context


def peer_certificate_name(transport: Any) -> str | None:
    """The CN of the client's verified certificate on an asyncio transport; None without one.

    The ``peercert`` extra is filled only for a certificate that verified against the server's CA.
    """
    if transport is None:
        return None
    peer = transport.get_extra_info("peercert")
    if not peer:
        return None
    for rdn in peer.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None
