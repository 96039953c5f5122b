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
