"""`plinth export`: how run times are read from the event log, what is left out, the scoring of a
replay, and one-line errors for bad input (a real subprocess against a control plane in virtual
time behind real HTTP; tests/control/test_export_fidelity.py exports a real `plinth up`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plinth.control import export as ex
from plinth.core.errors import SpecError
from plinth.core.throughput import FIXED_SPEED
from plinth.runtime.sim_behaviour import SimBehaviour
from plinth.sim.traces import load_trace

sys.path.insert(0, str(Path(__file__).parents[1] / "control"))
from virtual import VirtualPlatform  # noqa: E402 -- tests/control's harness
from virtual_http import served  # noqa: E402

SPEC = {"name": "j", "command": ["sleep", "1"], "resources": {"cpus": 0.5, "memory": 256,
                                                             "gpus": 1}}


def record(job_id: int, events: list[tuple[float, str]], *, state: str = "succeeded",
           spec: dict | None = None, tenant: str = "default", **extra) -> dict:
    return {"id": job_id, "name": f"job-{job_id}", "tenant": tenant, "state": state,
            "submit_time": events[0][0], "spec": {**SPEC, **(spec or {})}, "preemptions": 0,
            "events": [{"time": t, "kind": k, "message": ""} for t, k in events], **extra}


def test_run_time_is_the_last_attempt_unless_the_job_checkpointed():
    events = [(100.0, "submitted"), (101.0, "started"), (103.0, "stop-preempt"),
              (103.5, "preempted"), (104.0, "started"), (104.25, "launched"),
              (110.0, "succeeded")]
    exp = ex.build_export([record(1, events, preemptions=1),
                           record(2, events, checkpoint_step=7, preemptions=1)])
    rerun, resumed = exp.jobs
    # An attempt counts from the start decision: the wait for the victim's exit is in it.
    assert rerun.job.duration == pytest.approx(6.0)
    assert resumed.job.duration == pytest.approx(2.5 + 6.0)
    assert rerun.run_time_total == pytest.approx(8.5)
    assert rerun.first_start == pytest.approx(1.0) and rerun.end == pytest.approx(10.0)
    assert [a.ended_by for a in rerun.runs] == ["preempted", "succeeded"]
    assert rerun.runs[1].launch - rerun.runs[1].start == pytest.approx(0.25)
    assert rerun.job.job_type == FIXED_SPEED and rerun.job.name == "1"
    assert rerun.job.time_limit >= 24 * 3600  # the platform's estimate for a job without one
    assert ex.replay_config(exp, 30)["checkpoint_interval"] is None  # mixed: never


def test_jobs_not_finished_never_run_or_inexpressible_are_left_out_with_a_reason():
    ran = [(10.0, "submitted"), (11.0, "started"), (12.0, "failed")]
    exp = ex.build_export([
        record(1, [(5.0, "submitted")], state="pending"),
        record(2, [(6.0, "submitted"), (7.0, "cancelled")], state="cancelled"),
        record(3, ran, spec={"resources": {"gpus": 2}}),
        record(4, ran, spec={"workers": 2, "resources": {"gpu_fraction": 0.5}}),
        record(5, ran, spec={"resources": {"gpus": 0}}),
        record(6, ran, state="failed", spec={"workers": 3, "max_runtime": 60}),
    ])
    assert [m.platform_id for m in exp.jobs] == [6]
    only = exp.jobs[0]
    assert only.job.request.workers == 3 and only.job.time_limit == 60
    assert only.job.submit_time == 0.0 and exp.t0 == 10.0
    notes = "\n".join(exp.left_out)
    for needle in ("job 1 (job-1, pending): not finished", "job 2 (job-2, cancelled): never ran",
                   "2 GPUs per worker", "fractional gang (2 workers)", "CPU-only"):
        assert needle in notes
    assert ex.build_export([record(1, [(5.0, "submitted")], state="running")]).jobs == []


def test_the_export_round_trips_through_the_csv_loader(tmp_path):
    from plinth.sim.traces.csv import write_csv

    recs = [record(i, [(50.0 + i, "submitted"), (50.5 + i, "started"), (51.0 + 1.5 * i,
                                                                         "succeeded")],
                   spec={"priority": i, "resources": {"gpu_fraction": 0.25, "cpus": 0.1,
                                                      "memory": 64}}, tenant=f"t{i % 2}")
            for i in range(1, 4)]
    exp = ex.build_export(recs)
    path = tmp_path / "t.csv"
    write_csv([m.job for m in exp.jobs], str(path))
    meta = ex.meta(exp, policy="drf", config=ex.replay_config(exp, 0), source="test",
                   config_source="given")
    jobs, supplied = ex.replay_jobs(load_trace(str(path), "csv").jobs, json.loads(
        json.dumps(meta)))
    assert [j.name for j in jobs] == ["1", "2", "3"]
    assert [j.priority for j in jobs] == [1, 2, 3] and [j.tenant for j in jobs] == ["t1", "t0",
                                                                                      "t1"]
    assert all(j.request.gpu_milli == 250 and j.request.cpus_milli == 100 for j in jobs)
    assert [j.duration for j in jobs] == pytest.approx([1.0, 1.5, 2.0])
    assert "priority" in supplied or jobs[0].priority == 1  # until the loader reads it
    meta["jobs"].pop()
    with pytest.raises(SpecError, match="do not list the same jobs"):
        ex.replay_jobs(load_trace(str(path), "csv").jobs, meta)


def test_sched_config_from_the_sidecar():
    cfg = ex.sched_config({"min_runtime": 0.0, "restore_overhead": 0.0,
                           "checkpoint_interval": None})
    assert cfg.min_runtime == 0 and cfg.restore_overhead == 0
    assert math.isinf(cfg.checkpoint_interval)
    with pytest.raises(SpecError, match="unknown field 'min_run'"):
        ex.sched_config({"min_run": 1})


def test_quotas_as_the_control_plane_applies_them():
    rows = [{"name": "default", "gpus": None, "borrowing_limit": None},
            {"name": "a", "gpus": 3.0, "borrowing_limit": 1.0}]
    # the replay's cluster: 8 GPUs; `default`, without a quota, gets what `a`'s leaves
    cluster = ex.cluster_from_api([{"name": "n0", "cpus": 8, "memory_mib": 1024,
                                    "gpu_model": "A100", "gpus": 8}], rows)
    assert [(q.name, q.nominal_gpus, q.borrowing_limit) for q in cluster.tenants] == \
        [("default", 5.0, None), ("a", 3.0, 1.0)]
    assert ex.cluster_from_api([{"name": "n0", "cpus": 8, "memory_mib": 1024,
                                 "gpu_model": "A100", "gpus": 8}], rows[:1]).tenants == ()


def test_start_order_agreement():
    assert ex.start_order_agreement(list("abcd"), list("abcd")) == (1.0, 1.0, 1.0)
    # One job out of turn: three of four keep their relative order, but only one its position.
    same_order, same_rank, pairwise = ex.start_order_agreement(list("abcd"), list("bcda"))
    assert same_order == 0.75 and same_rank == 0.0 and pairwise == pytest.approx(3 / 6)
    with pytest.raises(ValueError):
        ex.start_order_agreement(list("ab"), list("ac"))


# --- the command, against a control plane in virtual time behind real HTTP -----------------

def plinth(*args: str, server: str | None = None, token: str | None = None, home=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLINTH_")}
    env["COLUMNS"] = "200"
    if server:
        env["PLINTH_SERVER"] = server
    if token:
        env["PLINTH_TOKEN"] = token
    if home:
        env["PLINTH_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "plinth.cli.main", "export", *args],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A control plane in virtual time (tests/control/virtual.py) as `plinth up --fake-gpus
    2xA100` starts one, behind real HTTP on loopback: `plinth export` runs as a process of its
    own against it. Yields (url, admin token, the platform)."""
    with VirtualPlatform(tmp_path_factory.mktemp("export"), cluster="1x2xA100",
                         min_runtime_s=30, grace_s=1) as vp, served(vp) as api:
        yield api.url, api.token, vp


def one_line(r: subprocess.CompletedProcess, needle: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_no_jobs_is_a_one_line_error(server, tmp_path):
    url, token, _ = server
    r = plinth("-o", str(tmp_path / "t.csv"), server=url, token=token)
    one_line(r, "nothing to export: none of the 0 jobs at")
    assert not (tmp_path / "t.csv").exists()


def test_an_unknown_home_or_server_is_a_one_line_error(server, tmp_path):
    url, _, _ = server
    # A home without a token: the server refuses, in one line.
    one_line(plinth("-o", str(tmp_path / "t.csv"), server=url, home=tmp_path / "nowhere"),
             "missing or unknown API token (HTTP 401)")
    from plinth.core.net import free_port

    one_line(plinth("--server", f"127.0.0.1:{free_port()}", token="x"),
             "cannot reach the control plane")
    one_line(plinth("--min-runtime", "-1", server=url, token="x"), "--min-runtime: must be >= 0")
    one_line(plinth("--round", "0", server=url, token="x"), "--round: must be > 0")


def test_a_running_job_is_left_out_with_a_note_and_the_rest_exported(server, tmp_path):
    from plinth.client import Client

    url, token, vp = server
    vp.behave("busy", SimBehaviour(exit_at=60.0))
    with Client(url, token) as c:
        done = c.submit({**SPEC, "name": "quick", "command": ["true"],
                         "resources": {"cpus": 0.1, "memory": 64, "gpus": 1}})
        vp.run_until(lambda: c.job(done)["state"] == "succeeded", limit_s=30)
        busy = c.submit({**SPEC, "name": "busy", "command": ["sleep", "60"],
                         "resources": {"cpus": 0.1, "memory": 64, "gpus": 1}})
        vp.step()
        assert c.job(busy)["state"] == "running"
        try:
            out = tmp_path / "run.csv"
            r = plinth("-o", str(out), server=url, token=token)
            assert r.returncode == 0, r.stderr
            assert f"job {busy} (busy, running): not finished" in r.stderr
            assert "exported 1 of 2 jobs" in r.stdout and "plinth sim --trace" in r.stdout
            trace = load_trace(str(out), "csv")
            assert [j.name for j in trace.jobs] == [str(done)]
            assert trace.jobs[0].duration == 1.0  # the quick job's second, as it ran
            assert "A100" in (tmp_path / "run.cluster.yaml").read_text()
            meta = ex.read_meta(tmp_path / "run.meta.json")
            assert meta["policy"] == "drf" and meta["sched_config"]["min_runtime"] == 30
            assert meta["sched_config"]["round_s"] == 360
            assert "--min-runtime 30 (reported by the control plane)" in meta["sched_config_source"]
            one_line(plinth("-o", str(tmp_path / "no" / "such" / "dir.csv"), server=url,
                            token=token), "cannot write")
        finally:
            c.cancel(busy)
