"""Gavel and Themis on the platform: lease ends and moves to other GPU models run
checkpoint-then-stop, and the next attempt resumes from the checkpoint. Gavel on a real control
plane, through the job SDK; Themis in virtual time (virtual.py), where its leases are seen to
end."""

from __future__ import annotations

import re

import pytest
from virtual import VirtualPlatform

from plinth.runtime.sim_behaviour import SimBehaviour

STEPS = 24


def resumable(name: str, sleep: float) -> dict:
    # max_runtime is also the estimate Themis computes finish-time fairness with.
    return {"name": name, "max_runtime": 120,
            "command": ["python", "examples/jobs/resumable.py", "--steps", str(STEPS),
                        "--sleep", str(sleep)],
            "resources": {"cpus": 0.1, "memory": "512Mi", "gpus": 2}}


@pytest.mark.slow
def test_leases_move_jobs_between_gpu_models_and_they_resume(tmp_path, platform_factory) -> None:
    # 2 A100 + 2 V100 as two fake nodes; three 2-GPU jobs share them in leases longer than a
    # restart (Python, torch, the checkpoint) and shorter than a job: Gavel's jobs hold 14.4 s
    # of steps, more than a round, so the third job cannot wait for the first two to finish
    # and some lease must end on a fast machine too.
    policy, round_s, sleep = "gavel", 10, 0.6
    p = platform_factory(tmp_path / "home", "--fake-gpus", "2xA100,2xV100", "--policy", policy,
                         "--round", str(round_s)).start()
    try:
        with p.client() as c:
            assert c.health()["policy"] == policy
            ids = [c.submit(resumable(f"r{i}", sleep)) for i in range(3)]
            assert [c.wait(j, timeout=180) for j in ids] == ["succeeded"] * 3
            models_of_attempts, moved = {}, 0
            for j in ids:
                log = c.logs(j)
                # No step lost or repeated: the total is the sum 1..STEPS exactly once.
                assert f"done at step {STEPS}, total {STEPS * (STEPS + 1) // 2}" in log
                attempts = re.findall(r"=== plinth: attempt (\d+) of job \d+ .* on (\S+) ===",
                                      log)
                models_of_attempts[j] = [node for _, node in attempts]
                # An attempt stopped while Python starts up saves nothing and prints nothing;
                # every one that got going resumed where the ones before had got to (a step is
                # saved, then printed: at most one saved step may not have been printed).
                last = 0
                for line in log.splitlines():
                    if m := re.fullmatch(r"step (\d+)", line):
                        last = int(m.group(1))
                    elif m := re.match(r"resumed from step (\d+)", line):
                        assert int(m.group(1)) in (last, last + 1), (line, last)
                # A step is printed after it is saved, so none is printed twice.
                printed = [int(s) for s in re.findall(r"^step (\d+)$", log, re.M)]
                assert len(printed) == len(set(printed)) and max(printed) == STEPS
                # A stop that lands as the job exits may run it once more: it then resumes
                # at the end and finishes at once, with the same total.
                assert set(re.findall(r"done at step (\d+), total (\d+)", log)) == {
                    (str(STEPS), str(STEPS * (STEPS + 1) // 2))}
                d = c.job(j)
                assert d["attempt"] == len(attempts) and d["checkpoint_step"] == STEPS
                moved += len(set(models_of_attempts[j])) > 1
            # Three jobs, two nodes: leases rotate, and a job moves to the other model.
            assert sum(len(a) for a in models_of_attempts.values()) > 3, models_of_attempts
            assert moved >= 1, models_of_attempts
    finally:
        p.stop()
        p.kill_jobs()


def test_themis_ends_leases_and_each_job_resumes_where_it_stopped(tmp_path) -> None:
    """Three 2-GPU jobs of 120 s of work on two 2-GPU nodes, in 6 s rounds: Themis ends the
    lease of a job whose finish-time fairness is better than a waiting one's, and the job goes
    on later from its checkpoint (saved as it stopped), with no second of its work lost or done
    twice."""
    with (VirtualPlatform(tmp_path, cluster="1x2xA100,1x2xV100", policy="themis",
                          round_s=6) as vp, vp.client() as c):
        assert c.health()["policy"] == "themis"
        for i in range(3):
            vp.behave(f"r{i}", SimBehaviour())  # ends when its work (its max_runtime) is done
        ids = [c.submit(resumable(f"r{i}", 0.0)) for i in range(3)]
        vp.run_until(lambda: all(c.job(j)["state"] == "succeeded" for j in ids), limit_s=3600)
        ended_leases = 0
        for j in ids:
            d = c.job(j)
            starts = [e["time"] for e in d["events"] if e["kind"] == "started"]
            ends = [e["time"] for e in d["events"] if e["kind"] in ("preempted", "succeeded")]
            assert d["attempt"] == len(starts) == len(ends) == d["preemptions"] + 1, d["events"]
            assert sum(e - s for s, e in zip(starts, ends)) == 120.0, d["events"]
            ended_leases += sum(e["kind"] == "stop-preempt" and "Themis: lease ended" in
                                e["message"] for e in d["events"])
        assert ended_leases >= 1


def test_a_policy_the_runtime_cannot_serve_is_refused_in_one_line(tmp_path) -> None:
    from plinth.control.service import ControlPlane
    from plinth.control.store import Store
    from plinth.core.errors import SpecError
    from plinth.runtime.local import LocalRuntime

    class NoRelaunch(LocalRuntime):  # a runtime whose attempts cannot move to other GPUs
        capabilities = frozenset({"checkpoint"})

    rt = NoRelaunch(tmp_path / "rt", fake_gpus="2xA100")
    store = Store(f"sqlite:///{tmp_path / 'plinth.db'}")
    try:
        with pytest.raises(SpecError, match=r"^--policy: gavel needs a runtime that can "
                                            r"relaunch; NoRelaunch cannot$"):
            ControlPlane(store, rt, home=tmp_path / "home", policy="gavel")
        cp = ControlPlane(store, rt, home=tmp_path / "home", policy="themis")  # no move needed
        assert cp.policy.name == "themis"
    finally:
        rt.close()
        store.close()
