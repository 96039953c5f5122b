"""The platform end to end: a real `plinth up` process, real jobs, real HTTP on loopback, for
what only a real process shows: its output, its environment, its exit code. What the control
plane decides about jobs (cancel, limits, refusals, tenants, quotas, policies) is tested in
virtual time in test_jobs_api.py."""

from __future__ import annotations

PY = "python"


def job(command: str | list[str], **extra) -> dict:
    spec = {"name": extra.pop("name", "t"), "command": command,
            "resources": {"cpus": 0.1, "memory": "1Gi", "gpus": 1}}
    spec["resources"].update(extra.pop("resources", {}))
    return {**spec, **extra}


def test_job_runs_and_its_story_is_recorded(shared_platform) -> None:
    with shared_platform.client() as c:
        j = c.submit(job(f"{PY} -c \"print('hello from plinth')\""))
        assert c.wait(j, timeout=60) == "succeeded"
        assert "hello from plinth" in c.logs(j)
        d = c.job(j)
        assert [e["kind"] for e in d["events"]] == ["submitted", "started", "succeeded"]
        assert d["exit_code"] == 0 and d["attempt"] == 1
        assert d["allocation"]["slots"][0]["gpus"] and d["end_time"] >= d["start_time"]
        assert j not in [x["id"] for x in c.jobs()] and j in [x["id"] for x in c.jobs(all=True)]


def test_failure_is_retried_then_failed(shared_platform) -> None:
    with shared_platform.client() as c:
        j = c.submit(job("echo attempt $PLINTH_ATTEMPT; exit 3", retries=1))
        assert c.wait(j, timeout=60) == "failed"
        d = c.job(j)
        assert d["exit_code"] == 3 and d["attempt"] == 2
        assert [e["kind"] for e in d["events"]].count("retry") == 1
        log = c.logs(j)
        assert "attempt 1" in log and "attempt 2" in log


def test_gang_and_fraction_environment(shared_platform) -> None:
    dump = (f"{PY} -c \"import os; print('ENV', os.environ['RANK'], os.environ['WORLD_SIZE'], "
            "os.environ['MASTER_ADDR'], os.environ['CUDA_VISIBLE_DEVICES'], "
            "os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'))\"")
    with shared_platform.client() as c:
        gang = c.submit(job(dump, workers=2))
        frac = c.submit(job(dump, resources={"gpus": 0, "gpu_fraction": 0.25,
                                             "gpu_memory": "2Gi"}))
        assert c.wait(gang, timeout=60) == "succeeded"
        assert c.wait(frac, timeout=60) == "succeeded"
        lines = sorted(ln for ln in c.logs(gang).splitlines() if ln.startswith("ENV"))
        assert [ln.split()[1:3] for ln in lines] == [["0", "2"], ["1", "2"]]
        assert lines[0].split()[4] != lines[1].split()[4]  # each worker its own GPU
        env = next(ln for ln in c.logs(frac).splitlines() if ln.startswith("ENV")).split()
        assert env[5] == "25"
