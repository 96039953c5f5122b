"""Kill the control plane with SIGKILL and restart it: nothing accepted is lost."""

from __future__ import annotations

import signal
import sqlite3
from contextlib import closing

import psutil
from plinth_platform import with_shims
from virtual import VirtualPlatform

from plinth.runtime.sim_behaviour import SimBehaviour


def spec(command: str, gpus: int = 1, name: str = "t") -> dict:
    return {"name": name, "command": command,
            "resources": {"cpus": 0.1, "memory": "1Gi", "gpus": gpus}}


def test_sigkill_restart_readopts_and_keeps_the_queue(platform, wait_for, tmp_path) -> None:
    flag = tmp_path / "release"
    with platform.client() as c:
        done = c.submit(spec("echo finished-before", name="done"))
        assert c.wait(done, timeout=60) == "succeeded"
        # Runs until the test lets it go; holds all 4 GPUs, so `queued` must wait.
        hog = c.submit(spec(f"while [ ! -e {flag} ]; do sleep 0.05; done; echo released",
                            gpus=3, name="hog"))
        short = c.submit(spec("sleep 1; echo short-done", name="short"))
        wait_for(lambda: platform.launched(hog) and platform.launched(short),
                 what="both launched")
        queued = c.submit(spec("echo queued-ran", gpus=4, name="queued"))
        wait_for(lambda: not c.job(queued)["reason"].startswith("queued"),
                 what="a pass has examined the queued job")
        assert c.job(queued)["state"] == "pending"
    ids = {done, hog, short, queued}

    platform.stop(signal.SIGKILL)
    # `short` exits while nobody watches; its exit code waits in its exit file
    wait_for(lambda: any((platform.home / "runtime" / "exit").glob(f"j{short}-*.exit")),
             what="short's exit file")
    platform.start()

    with platform.client() as c:
        assert {j["id"] for j in c.jobs(all=True)} >= ids  # no accepted job disappeared
        assert c.job(done)["state"] == "succeeded"
        h = c.job(hog)
        assert h["state"] == "running" and h["attempt"] == 1
        assert "re-adopted" in [e["kind"] for e in h["events"]]
        assert c.wait(short, timeout=30) == "succeeded" and c.job(short)["attempt"] == 1
        assert "short-done" in c.logs(short)
        assert c.job(queued)["state"] == "pending"
        flag.touch()
        assert c.wait(hog, timeout=30) == "succeeded"
        assert c.wait(queued, timeout=30) == "succeeded"
        assert "queued-ran" in c.logs(queued)


def _job_processes(platform, job_id: int) -> list[psutil.Process]:
    """This platform's processes for the job, and their shims: other test runs on the machine
    have jobs with the same small ids, so the platform's jobs folder (in the checkpoint path)
    must match too."""
    found = []
    for p in psutil.process_iter(["environ"]):
        env = p.info.get("environ") or {}
        if (env.get("PLINTH_JOB_ID") == str(job_id)
                and env.get("PLINTH_CHECKPOINT_DIR", "").startswith(str(platform.jobs_dir))):
            found.append(p)
    return with_shims(found)


def _running_sleep(platform, job_id: int) -> list[psutil.Process]:
    """The job's processes once its command, `sleep`, runs among them (else none)."""
    procs = _job_processes(platform, job_id)
    try:
        return procs if any(p.name() == "sleep" for p in procs) else []
    except psutil.NoSuchProcess:  # a launcher step that has just exec'd or exited
        return []


def test_job_lost_while_down_is_requeued(tmp_path) -> None:
    """The node "crashes" under the job while the control plane is down: no exit code is left
    behind, so the restarted one finds it lost and runs it again (in virtual time: the runtime's
    side, a vanished attempt found lost after a restart, is in the runtime contract suite)."""
    with VirtualPlatform(tmp_path) as vp:
        vp.behave("victim", SimBehaviour(exit_at=60.0, vanish_at=10.0), attempt=1)
        vp.behave("victim", SimBehaviour(exit_at=60.0), attempt=2)
        with vp.client() as c:
            j = c.submit(spec("sleep 60", name="victim"))
            vp.advance(5)
            assert c.job(j)["state"] == "running"
        vp.restart(down_s=10)
        with vp.client() as c:
            vp.step()
            assert c.job(j)["attempt"] == 2 and c.job(j)["state"] == "running"
            kinds = [e["kind"] for e in c.job(j)["events"]]
            assert kinds == ["submitted", "started", "lost", "started"]
            c.cancel(j)
            vp.run_until(lambda: c.job(j)["state"] == "cancelled", limit_s=30)


def test_a_launch_killed_before_it_was_stored_is_readopted(platform, wait_for) -> None:
    """kill -9 after the fork but before the handle is stored leaves the job running with no
    handle (staged here by clearing it): the restarted control plane finds its workers through
    the runtime's journal and re-adopts them, rather than starting a second copy beside them."""
    with platform.client() as c:
        j = c.submit(spec("sleep 60", name="unrecorded"))
        wait_for(lambda: platform.launched(j), what="launched")
        # All of them: the launcher forks on its way to `sleep`, so an early look sees fewer.
        procs = wait_for(lambda: _running_sleep(platform, j), what="the job's processes")
    platform.stop(signal.SIGKILL)
    with closing(sqlite3.connect(platform.home / "plinth.db")) as db, db:
        db.execute("UPDATE jobs SET handle = NULL WHERE id = ?", (j,))
    assert not platform.launched(j)
    platform.start()
    with platform.client() as c:
        kinds = [e["kind"] for e in c.job(j)["events"]]
        assert kinds == ["submitted", "started", "re-adopted"] and c.job(j)["attempt"] == 1, kinds
        assert {p.pid for p in _job_processes(platform, j)} == {p.pid for p in procs}
        c.cancel(j)
        assert c.wait(j, timeout=30) == "cancelled"
