"""A tenant attacks the files the control plane (root) writes for its FL task (issue 36, item 2).

The tenant's own folder of the jobs directory is the tenant's to write. Before it submits an FL
task, a job of the tenant plants there what the controller used to write or read as root: a link
to a root-only file where the task's `app.yaml` went, FIFOs where a token and the server's
`tree.json` are, and, for a second task, the whole task folder swapped for a link to a root-only
folder. Each test asserts that the root-only files are unchanged (content, owner, mode), that the
control plane wrote nothing through the plants and read nothing through them, and that the task
runs (the first) or fails with a reason (the second) while the control plane goes on answering.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sqlite3
import stat
import sys
import tempfile
from contextlib import closing
from pathlib import Path

import pytest
import yaml
from plinth_platform import Platform
from test_fl_tasks import app, start_client

from plinth.control.users import unreachable

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="tenants run as their own Unix users only as root"),
    pytest.mark.skipif(unreachable(Path(sys.executable)) is not None,
                       reason=f"tenants' jobs cannot run this Python ({sys.executable}): a "
                              "folder above it is closed to other users"),
]

TENANT = "mallory"
SECRET = "root-only: the admin's secret\n"


@pytest.fixture(scope="module")
def plat():
    """A root control plane with a jobs directory, a tenant with a token, and root-only files
    the tenant must not be able to change through the control plane."""
    root = Path(tempfile.mkdtemp(prefix="plinth-attack-"))
    root.chmod(0o755)  # /tmp/pytest-of-root is 0700: no tenant user could reach it
    secret = root / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    vault = root / "vault"  # a root-only folder, holding a store of fake rounds
    vault.mkdir(mode=0o700)
    (vault / "server").mkdir(mode=0o700)
    with closing(sqlite3.connect(vault / "server" / "meta.sqlite")) as db, db:
        db.execute("CREATE TABLE rounds (round INTEGER PRIMARY KEY, created REAL, "
                   "n_params INTEGER, state_names TEXT, record TEXT)")
        db.execute("INSERT INTO rounds VALUES (99, 0, 0, '', '{\"accuracy\": 0.99}')")
    p = Platform(root / "home", "--jobs-dir", str(root / "jobs")).start()
    p.root, p.secret, p.vault = root, secret, vault
    with p.client() as admin:
        admin.set_tenant(TENANT)
        p.tenant_token = admin.add_token(TENANT)
    p.user = pwd.getpwnam(f"plinth-{TENANT}")
    yield p
    p.stop()
    p.kill_jobs()
    shutil.rmtree(root, ignore_errors=True)


def _fingerprint(path: Path) -> tuple:
    st = os.lstat(path)
    return path.read_bytes(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def _tree(folder: Path) -> dict[str, tuple]:
    """Every file under a root-only folder, with its content, owner and mode."""
    return {str(f.relative_to(folder)): _fingerprint(f) for f in sorted(folder.rglob("*"))
            if f.is_file()}


def _next_workload(p: Platform) -> int:
    with p.client() as admin:
        return max((w["id"] for w in admin.workloads(all=True) if w["kind"] != "Job"),
                   default=0) + 1


def _plant(p: Platform, script: str) -> None:
    """Run `script` (sh) as a job of the tenant, in its own folder (its HOME), and wait."""
    with p.client(p.tenant_token) as c:
        j = c.submit({"name": "plant", "workdir": str(p.root),
                      "command": ["sh", "-ec", f'cd "$HOME"; {script}']})
        assert c.wait(j, timeout=60) == "succeeded", c.logs(j)


def _task(p: Platform, folder: Path, **server) -> Path:
    """The tiny digits FL task, with its tokens file the tenant's own."""
    folder.mkdir(mode=0o755)
    spec = app(folder)
    doc = yaml.safe_load(spec.read_text())
    doc["server"] |= server
    spec.write_text(yaml.safe_dump(doc))
    os.chown(folder / "tokens.txt", p.user.pw_uid, p.user.pw_gid)
    spec.chmod(0o644)
    return spec


def test_links_and_fifos_in_the_tenants_folder_send_no_write_of_roots_anywhere(plat, wait_for):
    """The task's folder holds a link to a root-only file where its app went, and FIFOs where
    the leaves' token and the server's tree.json are: the root-only file is unchanged, the
    controller's files are in its own folder (root:the tenant's group, 0640), the control loop
    never waits on a FIFO, and the task runs every round."""
    p, before = plat, _fingerprint(plat.secret)
    n = _next_workload(p)
    _plant(p, f"mkdir -p workload-{n}/server; ln -s {p.secret} workload-{n}/app.yaml; "
              f"ln -s {p.secret} workload-{n}/middles.tokens; mkfifo workload-{n}/leaf.token; "
              f"mkfifo workload-{n}/server/tree.json")
    spec = _task(p, p.root / "task-links", rounds=3,
                 aggregation={"mode": "tree", "max_leaves": 2})
    clients = []
    with p.client(p.tenant_token) as c:
        try:
            w = c.submit_workload(spec)
            assert w["id"] == n, w  # the planted folder is this task's
            assert _fingerprint(p.secret) == before  # nothing written through the link
            files = p.root / "jobs" / ".plinth" / TENANT / f"workload-{n}"
            for name in ("app.yaml", "leaf.token"):
                st = os.lstat(files / name)
                assert stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_gid) == \
                    (0, p.user.pw_gid) and stat.S_IMODE(st.st_mode) == 0o640, (name, st)
            for folder in (files, files.parent):
                st = os.lstat(folder)
                assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o750), (folder, st)
            clients = [start_client(spec, p, i, p.tenant_token) for i in range(2)]
            wait_for(lambda: c.workload(w["name"])["state"] != "active", 300, "the task to end")
            done = c.workload(w["name"])
            assert done["state"] == "succeeded", done
            assert [r["round"] for r in done["status"]["per_round"]] == [1, 2, 3]
        finally:
            for proc in clients:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    assert _fingerprint(p.secret) == before
    planted = p.root / "jobs" / TENANT / f"workload-{n}"
    assert os.readlink(planted / "app.yaml") == str(p.secret)  # left as the tenant made it
    assert stat.S_ISFIFO(os.lstat(planted / "leaf.token").st_mode)


def test_a_task_folder_swapped_for_a_link_is_neither_written_nor_read_through(plat, wait_for):
    """The task's folder is a link to a root-only folder (holding a round store of its own):
    nothing in that folder changes, the task's status shows none of its rounds, and the task
    fails with its server's reason (the tenant cannot write there) while other jobs run."""
    p, before = plat, _tree(plat.vault)
    n = _next_workload(p)
    _plant(p, f"ln -s {p.vault} workload-{n}")
    spec = _task(p, p.root / "task-swap", rounds=2)
    with p.client(p.tenant_token) as c:
        w = c.submit_workload(spec)
        assert w["id"] == n, w
        assert _tree(p.vault) == before  # no app.yaml (or anything) written into it
        wait_for(lambda: c.workload(w["name"])["state"] != "active", 180, "the task to fail")
        done = c.workload(w["name"])
        assert done["state"] == "failed", done
        assert done["status"].get("round", 0) == 0 and not done["status"].get("per_round"), \
            done["status"]  # the root-only store was not read through the link
        server = [u for u in done["units"] if u["unit"] == "server"]
        assert server and "Permission denied" in c.logs(server[-1]["job_id"]), server
        other = c.submit({"name": "after", "command": "true", "workdir": str(p.root)})
        assert c.wait(other, timeout=60) == "succeeded"
    assert _tree(p.vault) == before
    assert os.readlink(p.root / "jobs" / TENANT / f"workload-{n}") == str(p.vault)
