"""`plinth sim` end to end, in a real subprocess: results, JSON keys, plots, and one-line errors."""

import json
import os
import subprocess
import sys

import pytest

from plinth.sim.traces.csv import write_csv
from plinth.sim.traces.synthetic import synthetic_jobs

KEYS = {"policy", "jobs", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s",
        "gpu_utilization", "ftf_rho_median", "ftf_rho_max", "preemptions"}


def plinth(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "200"}  # a wide table, as on a terminal
    return subprocess.run([sys.executable, "-m", "plinth.cli.main", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env=env)


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "jobs.csv"
    write_csv(synthetic_jobs(200, seed=5, cluster_gpus=32, fractional=0.2), str(path))
    return path


def test_sim_compare_writes_json_and_plots(tmp_path, trace):
    out = tmp_path / "out"
    r = plinth("sim", "--trace", str(trace), "--format", "csv", "--cluster", "4x8xV100",
               "--compare", "fifo,sjf", "--json", str(tmp_path / "r.json"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [row["policy"] for row in rows] == ["fifo", "sjf"]
    for row in rows:
        assert KEYS <= row.keys()
        assert row["jobs"] == 200 and 0 < row["gpu_utilization"] <= 1
        assert row["p50_jct_s"] <= row["p99_jct_s"]
    assert (out / "sim_jct_cdf.png").stat().st_size > 1000
    assert (out / "sim_utilization.png").stat().st_size > 1000
    assert "avg JCT" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--cluster", "4x8xV1OO"], "V1OO"),
    (["--cluster", "0x0xV100"], "GPU"),
    (["--format", "slurm"], "slurm"),
    (["--window", "tomorrow"], "window"),
])
def test_bad_input_is_one_line_naming_the_culprit(trace, args, needle):
    base = {"--trace": str(trace), "--format": "csv", "--cluster": "4x8xV100", "--policy": "fifo"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    r = plinth("sim", *[x for kv in base.items() for x in kv], "--out", "")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_job_larger_than_cluster_names_the_line(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("job_id,submit_time,duration,num_gpus\nj1,0,100,4\nj2,5,100,64\n")
    r = plinth("sim", "--trace", str(path), "--cluster", "2x8xV100", "--out", "")
    assert r.returncode == 2
    assert "line 3" in r.stderr and "64 GPUs" in r.stderr and len(r.stderr.splitlines()) == 1


def test_malformed_row_names_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("job_id,submit_time,duration,num_gpus\nj1,0,100,4\nj2,5,abc,1\n")
    r = plinth("sim", "--trace", str(path), "--cluster", "2x8xV100", "--out", "")
    assert r.returncode == 2
    assert "bad.csv:3" in r.stderr and "duration" in r.stderr


def test_alibaba_replay_reports_the_allocation_ratio_at_first_failure(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                     "n0,32000,131072,2,T4\nn1,32000,131072,2,T4\n")
    pods = tmp_path / "pods.csv"
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time"]
    # 600 + 600 milli cannot share a GPU: with no departures the 4 GPUs hold 4 such pods,
    # and the 5th fails at 4 x 600 / 4000 = 60% allocated.
    for i in range(6):
        rows.append(f"p{i},1000,1024,1,600,,LS,Running,{i * 10},{i * 10 + 500},{i * 10}")
    pods.write_text("\n".join(rows) + "\n")
    r = plinth("sim", "--trace", str(pods), "--format", "alibaba", "--cluster", str(nodes),
               "--json", str(tmp_path / "a.json"), "--out", "")
    assert r.returncode == 0, r.stderr
    row = json.loads((tmp_path / "a.json").read_text())[0]
    assert row["gpu_alloc_ratio_at_first_failure"] == pytest.approx(0.6)
    assert KEYS <= row.keys() and row["jobs"] == 6
