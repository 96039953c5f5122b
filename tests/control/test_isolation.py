"""Tenants isolated on the machine (as root): a second tenant's job tries every escape the
issue lists (the admin token, the store, another tenant's log, checkpoints and environment, and
`kill`) and each one must fail. The same probes run as the admin's tenant show they can succeed,
so a pass means the isolation held, not that the probes were blind."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from plinth_platform import run_cli, tenant_platform

from plinth.core.net import free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant Unix users need root")

ATTACK = r'''
import json, os, signal, sys
from pathlib import Path

home, victim_log, victim_ckpt, pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
kill = sys.argv[5] == "kill"
out = {}

def probe(name, fn):
    try:
        got = fn()
        out[name] = "OPEN: " + repr(got)[:80]
    except PermissionError:
        out[name] = "denied"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"

probe("token", lambda: Path(home, "token").read_text())
# found through PLINTH_CHECKPOINT_DIR, as the report did: look for it in every folder above
mine = Path(os.environ["PLINTH_CHECKPOINT_DIR"])
def walk_up():
    for d in mine.parents:
        for name in ("token", "plinth.db"):
            try:
                return (d / name).read_bytes()[:20]
            except (FileNotFoundError, NotADirectoryError):
                pass
    raise PermissionError("nothing readable above the checkpoint dir")
probe("token-via-checkpoint-dir", walk_up)
probe("store", lambda: Path(home, "plinth.db").read_bytes()[:16])
probe("other-log", lambda: Path(victim_log).read_text())
probe("other-checkpoint", lambda: Path(victim_ckpt, "state").read_text())
probe("other-environ", lambda: Path(f"/proc/{pid}/environ").read_bytes())
if kill:
    probe("kill", lambda: os.kill(pid, signal.SIGKILL))
print("PROBES=" + json.dumps(out), flush=True)
'''


@pytest.fixture(scope="module")
def iso(tmp_path_factory):
    """A root control plane with a traversable jobs directory, and two tenants."""
    with tenant_platform("victim", "research") as p:
        (p.root / "attack.py").write_text(ATTACK)
        (p.root / "attack.py").chmod(0o644)
        yield p


def _victim(iso, wait_for) -> tuple[int, int]:
    """A running job of tenant `victim` with a secret in its env, a log line and a checkpoint."""
    with iso.client(iso.tokens["victim"]) as v:
        j = v.submit({"name": "victim", "env": {"SECRET": "hunter2"}, "workdir": str(iso.root),
                      "command": "echo victim-log-line; mkdir -p $PLINTH_CHECKPOINT_DIR; "
                                 "echo ckpt-secret > $PLINTH_CHECKPOINT_DIR/state; exec sleep 120"})
        wait_for(lambda: "victim-log-line" in v.logs(j), what="the victim's log line")
    ckpt = iso.root / "jobs" / "victim" / str(j) / "state"
    wait_for(ckpt.exists, what="the victim's checkpoint")
    pid = wait_for(lambda: next((pr.pid for pr in psutil.process_iter(["name", "environ"])
                                 if pr.info["name"] == "sleep" and
                                 (pr.info["environ"] or {}).get("PLINTH_JOB_ID") == str(j)),
                                None), what="the victim's process")
    return j, pid


def _attack(iso, token: str, victim: int, pid: int, kill: bool) -> dict:
    with iso.client(token) as c:
        a = c.submit({"name": "attack", "workdir": str(iso.root),
                      "command": ["python", str(iso.root / "attack.py"), str(iso.home),
                                  str(iso.home / "logs" / f"{victim}.log"),
                                  str(iso.root / "jobs" / "victim" / str(victim)), str(pid),
                                  "kill" if kill else "look"]})
        assert c.wait(a, timeout=60) == "succeeded", c.logs(a)
        line = next(x for x in c.logs(a).splitlines() if x.startswith("PROBES="))
    return json.loads(line.removeprefix("PROBES="))


def test_every_escape_fails_for_another_tenant(iso, wait_for) -> None:
    victim, pid = _victim(iso, wait_for)
    got = _attack(iso, iso.tokens["research"], victim, pid, kill=True)
    assert got == {k: "denied" for k in ("token", "token-via-checkpoint-dir", "store",
                                         "other-log", "other-checkpoint", "other-environ",
                                         "kill")}, got
    assert psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    with iso.client() as admin:
        assert admin.job(victim)["state"] == "running"
        # The same probes as the victim's own tenant do get through where they should: they
        # work. The admin's tenant is no exception to the rest: it does not run as root.
        control = _attack(iso, iso.tokens["victim"], victim, pid, kill=False)
        assert control["other-checkpoint"].startswith("OPEN")
        assert control["other-environ"].startswith("OPEN")
        assert control["token"] == control["store"] == "denied"
        assert _attack(iso, iso.token, victim, pid, kill=False) == {
            k: "denied" for k in ("token", "token-via-checkpoint-dir", "store", "other-log",
                                  "other-checkpoint", "other-environ")}
        admin.cancel(victim)


def test_files_belong_where_they_should(iso, wait_for) -> None:
    victim, _ = _victim(iso, wait_for)
    user = pwd.getpwnam("plinth-victim")
    def mode(p) -> int:
        return stat.S_IMODE(os.lstat(p).st_mode)

    assert mode(iso.home) == 0o700 and os.stat(iso.home).st_uid == 0
    for name in ("plinth.db", "token"):
        assert mode(iso.home / name) == 0o600
    for name in ("logs", "runtime"):
        assert mode(iso.home / name) == 0o700
    log = iso.home / "logs" / f"{victim}.log"
    assert os.stat(log).st_uid == user.pw_uid and mode(log) == 0o600
    tenant_dir = iso.root / "jobs" / "victim"
    assert os.stat(tenant_dir).st_uid == user.pw_uid and mode(tenant_dir) == 0o700
    assert os.stat(tenant_dir / str(victim)).st_uid == user.pw_uid  # made by the job itself
    with iso.client() as admin:
        admin.cancel(victim)


def test_jobs_run_as_their_tenants_user(iso) -> None:
    with iso.client() as admin:
        admin.set_tenant("mapped", user="nobody")  # an existing user
        t = admin.add_token("mapped")
        with pytest.raises(Exception, match="uid 0"):
            admin.set_tenant("rooted", user="root")
        with pytest.raises(Exception, match="no Unix user"):
            admin.set_tenant("ghost", user="no-such-user-here")
    for token, expect in ((iso.tokens["research"], "plinth-research"), (t, "nobody")):
        with iso.client(token) as c:
            j = c.submit({"name": "whoami", "workdir": str(iso.root),
                          "command": "echo user=$(id -un) home=$HOME"})
            assert c.wait(j, timeout=60) == "succeeded", c.logs(j)
            assert f"user={expect} " in c.logs(j)
    r = run_cli(iso, "tenant", "ls")
    assert "plinth-research" in r.stdout and "nobody" in r.stdout


def test_an_unprivileged_server_says_tenants_share_a_user(tmp_path) -> None:
    """Run as `nobody`, `plinth up` says once that isolation stops at the API."""
    home = Path(tempfile.mkdtemp(prefix="plinth-nobody-"))
    os.chown(home, pwd.getpwnam("nobody").pw_uid, -1)
    home.chmod(0o755)
    port = free_port()
    proc = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--init-groups",
                             "--", sys.executable, "-m",
                             "plinth.cli.main", "up", "--home", str(home / "h"), "--port",
                             str(port), "--fake-gpus", "1xA100"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=home)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("recovered" in x for x in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        text = "".join(lines)
        assert text.count("tenants share one Unix user (nobody)") == 1, text
        assert "isolated only at the API" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)


def test_up_warns_when_tenants_cannot_run_its_python() -> None:
    """A pyenv under /root (0700): a tenant's `python` would silently be another one, without
    Plinth's packages, so `plinth up` says so."""
    from plinth.control.server import ServerConfig, isolation_notes

    root = Path(tempfile.mkdtemp(prefix="plinth-py-"))
    try:
        root.chmod(0o755)
        for name, mode in (("closed", 0o700), ("open", 0o755)):
            (root / name / "bin").mkdir(parents=True)
            (root / name / "bin" / "python3").write_text("")
            (root / name / "bin" / "python3").chmod(0o755)
            (root / name).chmod(mode)
        cfg = ServerConfig(home=root / "home", jobs_dir=root / "jobs")
        fine = isolation_notes(cfg, python=str(root / "open" / "bin" / "python3"))
        assert fine == [("tenants' jobs run as their own Unix users; their folders are under "
                         f"{root / 'jobs'}")]
        first, warning = isolation_notes(cfg, python=str(root / "closed" / "bin" / "python3"))
        assert first == fine[0] and warning.startswith("warning: tenants' jobs cannot run")
        assert f"{root / 'closed'} is closed to other users" in warning
    finally:
        shutil.rmtree(root, ignore_errors=True)
