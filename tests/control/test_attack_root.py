"""The report's attacks on the node, made again as a tenant against a real `plinth up` running
as root (issue 36): root through the spec's environment, the admin's tenant as root, a FIFO that
froze the runtime's watcher, a log with no end, a workdir that told what root sees, and command
lines shown under a root process. Each test fails on the code before the fix."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest
from plinth_platform import tenant_platform

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tenants' Unix users need root")

LOG_LIMIT_MIB = 1


@pytest.fixture(scope="module")
def node():
    """A root control plane with a small log limit, and two tenants with tokens."""
    with tenant_platform("mallory", "bystander",
                         extra=("--log-limit", str(LOG_LIMIT_MIB))) as p:
        yield p


def _run(node, tenant: str | None, spec: dict) -> tuple[str, str]:
    """Submit as `tenant` (None: the admin) and wait for the end: (state, log)."""
    with node.client(node.tokens[tenant] if tenant else None) as c:
        j = c.submit({"workdir": str(node.root), **spec})
        return c.wait(j, timeout=120), c.logs(j)


def test_ld_preload_in_the_env_never_runs_as_root(node) -> None:
    """`env: {LD_PRELOAD: tenant.so}` was loaded into the root shim and into setpriv."""
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the attacker's library")
    lab = node.root / "lab"
    lab.mkdir(mode=0o755)
    uids = lab / "uids"
    uids.touch()
    uids.chmod(0o666)
    (lab / "evil.c").write_text(
        '#include <stdio.h>\n#include <unistd.h>\n'
        '__attribute__((constructor)) static void evil(void) {\n'
        f'  FILE *f = fopen("{uids}", "a"); if (f) {{ fprintf(f, "%d\\n", getuid()); '
        'fclose(f); } }\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lab / "evil.so"), str(lab / "evil.c")],
                   check=True)
    state, log = _run(node, "mallory", {"name": "preload", "command": ["/bin/true"],
                                         "env": {"LD_PRELOAD": str(lab / "evil.so")}})
    assert state == "succeeded", log
    mallory = pwd.getpwnam("plinth-mallory").pw_uid
    seen = {int(u) for u in uids.read_text().split()}
    assert seen == {mallory}  # it ran (the attack was live), and only as the tenant


def test_the_admins_tenant_does_not_run_as_root(node) -> None:
    state, log = _run(node, None, {"name": "whoami", "command": "echo uid=$(id -u) $(id -un)"})
    assert state == "succeeded", log
    assert f"uid={pwd.getpwnam('plinth-default').pw_uid} plinth-default" in log


def test_a_fifo_marker_does_not_freeze_other_tenants(node, wait_for) -> None:
    """A FIFO named as the checkpoint marker blocked the runtime's only watcher thread: no job
    of any tenant ended after it, and cancels stayed in `stopping`."""
    with node.client(node.tokens["mallory"]) as m:
        trap = m.submit({"name": "fifo", "workdir": str(node.root), "command":
                         'mkdir -p "$PLINTH_CHECKPOINT_DIR" && '
                         'mkfifo "$PLINTH_CHECKPOINT_DIR/.plinth-checkpoint.json" && '
                         'echo planted && exec sleep 300'})
        wait_for(lambda: "planted" in m.logs(trap), timeout=60, what="the planted FIFO")
        state, log = _run(node, "bystander", {"name": "after", "command": "true"})
        assert state == "succeeded", log
        m.cancel(trap)
        assert m.wait(trap, timeout=60) == "cancelled"


def test_a_log_is_cut_at_the_limit(node) -> None:
    state, log = _run(node, "mallory", {"name": "flood", "command": [
        "python", "-c", "import os\nfor _ in range(48): os.write(1, b'y' * 65536)"]})
    assert state == "succeeded"  # the job itself was not hurt
    job = int(log.split(" of job ")[1].split()[0])
    text = (node.home / "logs" / f"{job}.log").read_bytes()  # 3 MiB written
    assert len(text) < LOG_LIMIT_MIB * 2**20 + 4096 and b"[plinth] log cut at" in text[-200:]


def test_a_workdir_tells_nothing_root_sees(node) -> None:
    """Checked as root, a workdir under /root ran when it existed and was refused when not:
    a tenant learned what is there. As the tenant, both are denied alike."""
    probe = Path(tempfile.mkdtemp(prefix="plinth-secret-"))  # 0700, root's
    (probe / "there").mkdir()
    try:
        outs = []
        for wd in (probe / "there", probe / "absent"):
            state, log = _run(node, "mallory", {"name": "probe", "command": "true",
                                                 "workdir": str(wd)})
            outs.append((state, log.replace(wd.name, "WD").splitlines()[-1]))
        assert outs[0] == outs[1] and outs[0][0] == "failed", outs
        assert "Permission denied" in outs[0][1]
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def test_no_tenant_command_line_shows_under_a_root_process(node, wait_for) -> None:
    secret = "--password=sw0rdfish"
    with node.client(node.tokens["mallory"]) as m:
        j = m.submit({"name": "argv", "workdir": str(node.root), "command": [
            "python", "-c", "import time; print('up', flush=True); time.sleep(300)", secret]})
        wait_for(lambda: "up" in m.logs(j), timeout=60, what="the job to start")
        mine = [p for p in psutil.process_iter(["cmdline", "uids"])
                if secret in (p.info["cmdline"] or [])]
        assert mine and all(p.info["uids"].real != 0 for p in mine)  # only the job's own
        m.cancel(j)
