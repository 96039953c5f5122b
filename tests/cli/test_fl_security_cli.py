"""`plinth fl` safe defaults and its security commands, as real subprocesses (issue 19,
findings 4 and 5): loopback and tokens by default, a warning for plaintext beyond loopback,
`plinth fl certs` and `--tls DIR`, `plinth fl tokens`, and `plinth fl consent …` against a live
server on 127.0.0.1."""

import csv
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml
from cryptography import x509

from plinth.core.errors import PlinthError
from plinth.fl.privacy.consent import ConsentService
from plinth.fl.transport.grpc import GrpcClient, GrpcTransport, load_tokens


def plinth(*args, env=None):
    return subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", *args],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


TINY = Path(__file__).parents[1] / "fl" / "apps" / "tiny.py"


def _app(tmp_path, **extra):
    app = tmp_path / "app.yaml"
    app.write_text(yaml.safe_dump({"name": "t", "code": str(TINY), "server": {"wait_timeout": 1},
                                   **extra}))
    return app


def test_server_defaults_to_loopback_and_refuses_to_run_without_tokens(tmp_path):
    assert "127.0.0.1:8080" in plinth("server", "--help").stdout
    r = plinth("server", str(_app(tmp_path)), "--address", "127.0.0.1:0")
    assert r.returncode != 0
    err = r.stderr.strip()
    assert "transport.tokens" in err and "--no-tokens" in err and "\n" not in err


@pytest.mark.slow
def test_plaintext_beyond_loopback_warns_and_loopback_does_not(tmp_path):
    app = str(_app(tmp_path))
    wide = plinth("server", app, "--address", "0.0.0.0:0", "--no-tokens")
    assert "plaintext" in wide.stderr and "--tls DIR" in wide.stderr
    near = plinth("server", app, "--address", "127.0.0.1:0", "--no-tokens")
    assert "plaintext" not in near.stderr
    # both then wait for clients that never come, and say so
    assert all("clients joined" in r.stderr for r in (wide, near))


def test_certs_make_a_pair_that_tls_clients_pin(tmp_path):
    d = tmp_path / "certs"
    assert plinth("certs", str(d)).returncode == 0
    cert, key = (d / "server.pem").read_bytes(), (d / "server.key").read_bytes()
    assert stat.S_IMODE((d / "server.key").stat().st_mode) == 0o600
    names = x509.load_pem_x509_certificate(cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    server = GrpcTransport("127.0.0.1:0", cert=cert, key=key)
    try:
        pinned = GrpcClient(f"localhost:{server.port}", client_id="x", ca=cert,
                            connect_timeout=10)
        assert pinned.join()["client_id"] == "x"
        pinned.channel.close()
        plain = GrpcClient(f"localhost:{server.port}", client_id="y", connect_timeout=2)
        with pytest.raises(PlinthError, match="cannot join"):
            plain.join()
        plain.channel.close()
    finally:
        server.close()


def test_tokens_writes_one_secret_per_client(tmp_path):
    f = tmp_path / "tokens.txt"
    assert plinth("tokens", str(f), "--clients", "3").returncode == 0
    tokens = load_tokens(str(f))
    assert sorted(tokens.values()) == ["0", "1", "2"] and len(set(tokens)) == 3
    assert all(len(t) >= 40 for t in tokens) and stat.S_IMODE(f.stat().st_mode) == 0o600


@pytest.mark.slow
def test_consent_grant_list_revoke_and_audit_through_the_cli(tmp_path):
    db = tmp_path / "consent.sqlite"
    app = str(_app(tmp_path, consent={"purpose": "research", "registry": str(db)}))
    server = GrpcTransport("127.0.0.1:0", tokens={"tok-7": "7"},
                           consent=ConsentService(str(db), "research", wall=time.time).handle)
    addr = f"127.0.0.1:{server.port}"
    try:
        grant = plinth("consent", "grant", app, "--server", addr, "--token", "tok-7",
                       "--version", "2")
        assert grant.returncode == 0, grant.stderr
        assert "client 7: consent granted for 'research' (version 2)" in grant.stdout
        listed = plinth("consent", "list", app, "--server", addr,
                        env={"PLINTH_FL_TOKEN": "tok-7"})
        assert "research version 2: live" in listed.stdout and "granted" in listed.stdout
        revoke = plinth("consent", "revoke", app, "--server", addr, "--token", "tok-7")
        assert "client 7: revoked for 'research'" in revoke.stdout
        forged = plinth("consent", "grant", app, "--server", addr, "--token", "nope")
        assert forged.returncode != 0 and "UNAUTHENTICATED" in forged.stderr
    finally:
        server.close()
    out = tmp_path / "audit.csv"
    audit = plinth("consent", "audit", app, "--export", str(out))
    assert audit.returncode == 0, audit.stderr
    rows = list(csv.DictReader(out.open()))
    assert [(r["client_id"], r["event"]) for r in rows] == [("7", "granted"), ("7", "revoked")]
    shown = plinth("consent", "audit", app, "--client", "7")
    assert "revoked" in shown.stdout and "research" in shown.stdout


def test_consent_without_a_token_is_one_line(tmp_path):
    app = str(_app(tmp_path, consent={"purpose": "p", "registry": str(tmp_path / "c.db")}))
    r = plinth("consent", "grant", app, "--server", "127.0.0.1:1",
               env={"PLINTH_FL_TOKEN": ""})
    assert r.returncode != 0 and "--token" in r.stderr and r.stderr.strip().count("\n") == 0


def test_grpc_unavailable_is_reported(tmp_path):
    """A server that is not there: the consent call fails with the address, not a hang."""
    app = str(_app(tmp_path, consent={"purpose": "p", "registry": str(tmp_path / "c.db")}))
    r = plinth("consent", "revoke", app, "--server", "127.0.0.1:9", "--token", "t")
    assert r.returncode != 0 and "127.0.0.1:9" in r.stderr
    assert grpc.StatusCode.DEADLINE_EXCEEDED.name in r.stderr or "UNAVAILABLE" in r.stderr


def test_several_clients_in_one_process_each_need_a_token_from_the_file(tmp_path):
    """`plinth fl client --cids A-B --tokens FILE`: bad ranges, a missing file, an id the
    file has no token for, and --cids mixed with --token are each one line, before anything
    is dialled."""
    app = str(_app(tmp_path))
    tokens = tmp_path / "tokens.txt"
    assert plinth("tokens", str(tokens), "--clients", "2").returncode == 0
    cases = [
        (["--cids", "0-x", "--tokens", str(tokens)], "--cids: expected a range A-B or a list"),
        (["--cids", "0,0", "--tokens", str(tokens)], "names no client or one twice"),
        (["--cids", "0-1"], "--tokens: several clients in one process each need their own"),
        (["--cids", "0-2", "--tokens", str(tokens)], "has no token for client 2"),
        (["--cids", "0-1", "--tokens", str(tokens), "--token", "t"], "not both"),
        (["--cids", "0-1", "--tokens", str(tmp_path / "none.txt")], "cannot read"),
    ]
    for args, want in cases:
        r = plinth("client", app, "--server", "127.0.0.1:1", *args)
        assert r.returncode != 0 and want in r.stderr, (args, r.stderr)
        assert r.stderr.strip().count("\n") == 0, r.stderr
