"""Tokens (revoke, expiry, listed by id), TLS, the --host warning and a clean job environment:
each property tested by trying to get around it."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from plinth_platform import TlsPlatform, self_signed
from plinth_platform import run_cli as cli

from plinth.client import ApiError, Client
from plinth.control.server import ServerConfig, check_network


def test_a_revoked_token_stops_working_at_once(shared_platform) -> None:
    with shared_platform.client() as admin:
        admin.set_tenant("revokee")
        t = admin.new_token("revokee")
        listed = admin.tokens("revokee")
        assert [r["id"] for r in listed] == [t["id"]]
        assert t["token"] not in json.dumps(admin.tokens())  # listed by id, never by secret
        with shared_platform.client(t["token"]) as user:
            assert user.jobs() == []
            with pytest.raises(ApiError) as e:  # a tenant cannot list or revoke tokens
                user.revoke_token(t["id"])
            assert e.value.status == 403
            admin.revoke_token(t["id"])
            with pytest.raises(ApiError) as e:
                user.jobs()
            assert e.value.status == 401
        assert admin.tokens("revokee") == []
        with pytest.raises(ApiError, match="not found") as e:
            admin.revoke_token(t["id"])
        assert e.value.status == 404


def test_an_expired_token_is_refused(shared_platform) -> None:
    with shared_platform.client() as admin:
        admin.set_tenant("shortlived")
        t = admin.new_token("shortlived", expires_in=1.0)
        assert t["expires"] == pytest.approx(time.time() + 1.0, abs=5)
        with shared_platform.client(t["token"]) as user:
            assert user.jobs() == []
            time.sleep(max(0.0, t["expires"] - time.time()) + 0.1)
            with pytest.raises(ApiError) as e:
                user.jobs()
            assert e.value.status == 401


def test_tenant_token_commands(shared_platform) -> None:
    cli(shared_platform, "tenant", "set", "cli-tokens")
    r = cli(shared_platform, "tenant", "token", "cli-tokens", "--expires", "30d")
    assert r.returncode == 0, r.stderr
    secret, token_id = r.stdout.strip(), r.stderr.split()[2]
    r = cli(shared_platform, "tenant", "tokens", "cli-tokens")
    assert token_id in r.stdout and secret not in r.stdout
    r = cli(shared_platform, "tenant", "revoke", token_id)
    assert r.returncode == 0 and "revoked" in r.stdout
    r = cli(shared_platform, "ls", token=secret)
    assert r.returncode == 2 and "unknown API token" in r.stderr
    r = cli(shared_platform, "tenant", "token", "cli-tokens", "--expires", "soon")
    assert r.returncode == 2 and "--expires" in r.stderr


def test_non_loopback_host_without_tls_warns(tmp_path) -> None:
    assert check_network(ServerConfig(home=tmp_path)) == []
    [warning] = check_network(ServerConfig(home=tmp_path, host="0.0.0.0"))
    assert "0.0.0.0 without TLS" in warning and "--tls-cert" in warning
    cert, key = self_signed(tmp_path / "tls")
    assert check_network(ServerConfig(home=tmp_path, host="0.0.0.0", tls_cert=cert,
                                      tls_key=key)) == []


@pytest.fixture(scope="module")
def tls_platform(tmp_path_factory):
    """A server with TLS, a small body cap, and secrets in its own environment."""
    import os

    secrets = {"PLINTH_TEST_SERVER_SECRET": "s3cret", "AWS_SECRET_ACCESS_KEY": "also-secret"}
    saved = {k: os.environ.get(k) for k in secrets}
    os.environ.update(secrets)
    p = TlsPlatform(tmp_path_factory.mktemp("tls") / "home", "--max-body", "4096")
    try:
        p.start()
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.update({k: v})
    yield p
    p.stop()
    p.kill_jobs()


def test_tls_serves_https_only(tls_platform) -> None:
    url = tls_platform.url
    with tls_platform.client() as c:
        assert c.health()["status"] == "ok"
    with pytest.raises(httpx.HTTPError):  # plain HTTP gets no answer from a TLS port
        httpx.get(f"http://127.0.0.1:{tls_platform.port}/v1/health", timeout=5)
    with (pytest.raises(Exception, match="cannot reach|CERTIFICATE_VERIFY_FAILED"),
          Client(url, tls_platform.token) as c):  # not a CA the system trusts
        c.health()
    log = (tls_platform.home / "server.log").read_text()
    assert f"https://127.0.0.1:{tls_platform.port}" in log


def test_body_cap_is_configurable(tls_platform) -> None:
    with tls_platform.client() as c:
        with pytest.raises(ApiError, match="limit is 4096 bytes") as e:
            c.submit({"name": "big", "command": ["true"], "env": {"X": "x" * 5000}})
        assert e.value.status == 413


def test_jobs_get_a_clean_environment(tls_platform) -> None:
    with tls_platform.client() as c:
        j = c.submit({"name": "env", "env": {"MINE": "1"},
                      "command": ["python", "-c", ("import json, os; "
                                                   "print('ENV=' + json.dumps(dict(os.environ)))")]})
        assert c.wait(j, timeout=60) == "succeeded"
        line = next(x for x in c.logs(j).splitlines() if x.startswith("ENV="))
    env = json.loads(line[4:])
    assert "PLINTH_TEST_SERVER_SECRET" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["MINE"] == "1" and env["PLINTH_JOB_ID"] == str(j) and "PATH" in env
    allowed = {"PATH", "HOME", "LANG", "MINE", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES",
               "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
               "LOCAL_WORLD_SIZE", "USER", "LOGNAME"}  # the last two: its tenant's user
    assert {k for k in env if not k.startswith("PLINTH_")} <= allowed | {"PWD", "SHLVL", "_"}
