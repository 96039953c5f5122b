"""Self-signed TLS material for an FL server (`plinth fl certs DIR`), and client tokens
(`plinth fl tokens FILE`).

`plinth fl certs DIR` writes ``DIR/server.pem`` (a certificate that is its own CA) and
``DIR/server.key`` (its private key, mode 0600). The server takes both with ``--tls DIR``; a
client takes the same folder (it only reads ``server.pem``, the CA it pins). Keys come from the
`cryptography` library (ECDSA P-256), tokens from `secrets`.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from plinth.core.errors import SpecError

CERT, KEY = "server.pem", "server.key"


def self_signed(hosts: list[str], *, days: int = 365) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) for `hosts` (names or IP addresses)."""
    if not hosts:
        raise SpecError("--host: name at least one host the certificate is for")
    if days < 1:
        raise SpecError(f"--days: must be at least 1, got {days}")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    alt: list[x509.GeneralName] = []
    for h in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            alt.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_pair(folder: str | Path, hosts: list[str], *, days: int = 365) -> tuple[Path, Path]:
    """Write DIR/server.pem and DIR/server.key (0600); their paths."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    cert, key = self_signed(hosts, days=days)
    (d / CERT).write_bytes(cert)
    _write_secret(d / KEY, key)
    return d / CERT, d / KEY


def tls_files(folder: str) -> dict[str, str]:
    """The app's `transport.tls` for a `plinth fl certs` folder: the pair, and the cert as CA."""
    d = Path(folder)
    if not (d / CERT).is_file():
        raise SpecError(f"--tls: {d / CERT} does not exist (make it with plinth fl certs {d})")
    return {"cert": str(d / CERT), "key": str(d / KEY), "ca": str(d / CERT)}


def write_tokens(path: str | Path, client_ids: list[str]) -> Path:
    """A tokens file (`client_id token` lines, 0600) with a fresh 256-bit token per id."""
    p = Path(path)
    lines = [f"{cid} {secrets.token_urlsafe(32)}" for cid in client_ids]
    _write_secret(p, ("\n".join(lines) + "\n").encode())
    return p
