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


# -- the same workload as other simulators: job types, a throughput matrix, rounds -----------

TYPES = ("ResNet-50 (batch size 64)", "A3C")


@pytest.fixture
def typed_trace(tmp_path):
    """60 one-GPU jobs of two types, arriving faster than 4 GPUs finish them."""
    lines = ["job_id,submit_time,duration,num_gpus,job_type"]
    for i in range(60):
        lines.append(f"j{i},{i * 30},{600 + (i * 37) % 900},1,{TYPES[i % 2]}")
    path = tmp_path / "typed.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def matrix(tmp_path, name: str, k80: tuple[float, float]) -> str:
    """A CSV matrix: throughputs on a V100 and a K80 for each of TYPES."""
    path = tmp_path / name
    path.write_text("job_type,V100,K80\n" + "".join(
        f"{t},10,{10 * s}\n" for t, s in zip(TYPES, k80)))
    return str(path)


def sim_rows(tmp_path, trace, *args, name="r.json"):
    out = tmp_path / name
    r = plinth("sim", "--trace", str(trace), "--cluster", "1x2xV100,1x2xK80", "--json",
               str(out), "--out", "", *args)
    assert r.returncode == 0, r.stderr
    return {row["policy"]: row for row in json.loads(out.read_text())}


def test_rounds_and_throughputs_are_in_every_row(tmp_path, typed_trace):
    gavel = json.dumps({"v100": {f"('{TYPES[0]}', 1)": {"null": 10.0}, f"('{TYPES[1]}', 1)": 4.0},
                        "k80": {f"('{TYPES[0]}', 1)": {"null": 1.0}, f"('{TYPES[1]}', 1)": 3.0}})
    (tmp_path / "gavel.json").write_text(gavel)
    rows = sim_rows(tmp_path, typed_trace, "--compare", "gavel,themis,fifo", "--throughputs",
                    str(tmp_path / "gavel.json"), "--rounds", "120")
    for name in ("gavel", "themis"):
        assert rows[name]["rounds"] == "120 s" and rows[name]["round_s"] == 120
    assert rows["fifo"]["rounds"] is None and rows["fifo"]["round_s"] is None
    assert {row["throughputs"] for row in rows.values()} == {str(tmp_path / "gavel.json")}
    assert all(row["completed"] == 60 for row in rows.values())
    default = sim_rows(tmp_path, write_untyped(tmp_path), "--policy", "gavel",
                       name="d.json")["gavel"]
    assert default["rounds"] == "360 s" and default["throughputs"] == "built-in"


def write_untyped(tmp_path):
    path = tmp_path / "untyped.csv"
    path.write_text("job_id,submit_time,duration,num_gpus\n" + "".join(
        f"u{i},{i * 60},900,1\n" for i in range(20)))
    return path


def test_rounds_off_reallocates_at_every_event(tmp_path, typed_trace):
    thr = matrix(tmp_path, "m.csv", (0.1, 0.75))
    rounds = sim_rows(tmp_path, typed_trace, "--compare", "gavel,themis", "--throughputs", thr)
    off = sim_rows(tmp_path, typed_trace, "--compare", "gavel,themis", "--throughputs", thr,
                   "--rounds", "off", name="off.json")
    for name in ("gavel", "themis"):
        assert off[name]["rounds"] == "off (every event)" and off[name]["round_s"] == 0
        assert off[name]["completed"] == 60
        # Without rounds nobody waits for a lease to end: no round-end wake-ups, so the
        # replay is a different one (fewer passes).
        assert off[name]["passes"] < rounds[name]["passes"]


def test_a_heterogeneous_result_follows_the_matrix(tmp_path, typed_trace):
    # The same trace and cluster; only the K80's speed for each job type differs. FIFO's
    # decisions ignore speeds, so its result moves only because the jobs ran at other speeds.
    a = sim_rows(tmp_path, typed_trace, "--compare", "gavel,themis,fifo", "--throughputs",
                 matrix(tmp_path, "a.csv", (0.1, 0.9)), name="a.json")
    b = sim_rows(tmp_path, typed_trace, "--compare", "gavel,themis,fifo", "--throughputs",
                 matrix(tmp_path, "b.csv", (0.9, 0.1)), name="b.json")
    for name in ("gavel", "themis", "fifo"):
        assert (a[name]["avg_jct_s"], a[name]["preemptions"]) != \
            (b[name]["avg_jct_s"], b[name]["preemptions"]), name
    # The same matrix twice gives the same numbers: the difference is the matrix's.
    again = sim_rows(tmp_path, typed_trace, "--policy", "fifo", "--throughputs",
                     matrix(tmp_path, "a2.csv", (0.1, 0.9)), name="a2.json")
    assert again["fifo"]["avg_jct_s"] == a["fifo"]["avg_jct_s"]


@pytest.mark.parametrize("content, suffix, needle", [
    ('{"v100": {"A3C": {"null": -2}}}', "json", "v100 -> A3C -> null: expected a positive "
                                                "throughput, got -2"),
    ("job_type,V100,K80\nA3C,4,x\n", "csv", ":2: A3C,K80: expected a positive throughput, "
                                            "got 'x'"),
    ("job_type,V100\nsomething-else,1\n", "csv", "job type 'A3C' (line 3) is not in the "
                                                 "throughputs"),
])
def test_bad_throughputs_are_one_line(tmp_path, content, suffix, needle):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,duration,num_gpus,job_type\n"
                     "a,0,100,1,\nb,5,100,1,A3C\n")
    thr = tmp_path / f"thr.{suffix}"
    thr.write_text(content)
    r = plinth("sim", "--trace", str(trace), "--cluster", "2x8xV100", "--policy", "gavel",
               "--throughputs", str(thr), "--out", "")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_bad_rounds_is_one_line(trace):
    r = plinth("sim", "--trace", str(trace), "--cluster", "4x8xV100", "--policy", "gavel",
               "--rounds", "soon", "--out", "")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--rounds" in lines[0] and "'soon'" in lines[0], r.stderr
