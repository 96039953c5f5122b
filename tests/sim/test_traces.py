"""Trace loaders: sorting and renumbering, windows, every bad-input message, synthetic workloads."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from plinth.core.errors import SpecError, TraceError
from plinth.core.resources import Request
from plinth.sim.traces import apply_window, load_trace, parse_window, synthetic_jobs, write_csv
from plinth.sim.traces.synthetic import synthetic_trace

PHILLY = """\
timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,vc-a
2017-10-09 06:13:03,2951.0,4,11804.0,vc-b
2017-10-09 07:01:55,10,8,80,vc-c
2017-10-10 06:13:03,5,2,10,
"""

ALIBABA = """\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
pod-a,12000,16384,1,1000,,LS,Running,100,1100,100
pod-b,6000,12288,1,460,V100M16|V100M32,BE,Running,50,1050,60
pod-c,8000,30517,0,0,,Burstable,Running,200,500,
pod-d,88000,327680,8,1000,nan,Guaranteed,Succeeded,300,900,310
pod-e,4000,8192,1,200,,BE,Pending,400,400,
"""

GENERIC = """\
job_id,submit_time,duration,num_gpus,tenant,gpu_milli,gpu_model
j1,100,50,2,alice,,
j2,10,20,1,,250,T4|v100
j3,100,5.5,1,bob,1000,A100
"""


def write(tmp_path, text, name):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def trace_error(path, fmt, **kw) -> str:
    with pytest.raises(TraceError) as e:
        load_trace(path, fmt, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


# --- Philly -------------------------------------------------------------------------------------

def test_philly_sorted_renumbered_rebased(tmp_path):
    tr = load_trace(write(tmp_path, PHILLY, "philly.csv"), "philly")
    assert tr.format == "philly" and tr.source.endswith("philly.csv")
    assert [j.id for j in tr.jobs] == [0, 1, 2, 3]
    # the 06:13 row comes first; the two 07:01:55 rows keep their file order
    assert [j.tenant for j in tr.jobs] == ["vc-b", "vc-a", "vc-c", "default"]
    assert [j.submit_time for j in tr.jobs] == [0.0, 2932.0, 2932.0, 86400.0]
    assert [j.source_line for j in tr.jobs] == [3, 2, 4, 5]
    assert tr.jobs[0].request == Request(gpus=1, workers=4) and tr.jobs[0].duration == 2951.0
    assert tr.jobs[1].request == Request(gpus=1, workers=1)


@pytest.mark.parametrize("row, expected", [
    ("2017-10-09 07:01:55,66.0,x,66.0,vc", ":3: num_gpus: expected a positive integer, got 'x'"),
    ("2017-10-09 07:01:55,66.0,0,66.0,vc", ":3: num_gpus: expected a positive integer, got '0'"),
    ("2017-10-09 07:01:55,0,1,0,vc", ":3: duration: expected a positive number, got '0'"),
    ("2017-10-09 07:01:55,nan,1,0,vc", ":3: duration: expected a positive number, got 'nan'"),
    ("yesterday,5,1,5,vc", ":3: timestamp: expected a time like 2017-10-09 07:01:55, got 'yest"),
    ("2017-10-09 07:01:55,5", ":3: expected 5 fields, got 2"),
])
def test_philly_bad_rows(tmp_path, row, expected):
    text = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:00:00,5,1,5,vc\n" + row
    path = write(tmp_path, text + "\n", "philly.csv")
    assert path + expected in trace_error(path, "philly")


def test_philly_missing_column_and_empty(tmp_path):
    path = write(tmp_path, "timestamp,duration,gpus\n2017-10-09 07:00:00,5,1\n", "philly.csv")
    assert f"{path}:1: missing required column 'num_gpus'" in trace_error(path, "philly")
    empty = write(tmp_path, "timestamp,duration,num_gpus\n", "empty.csv")
    assert f"{empty}:1: trace has no jobs" in trace_error(empty, "philly")
    nothing = write(tmp_path, "", "nothing.csv")
    assert f"{nothing}:1: empty file" in trace_error(nothing, "philly")


# --- Alibaba ------------------------------------------------------------------------------------

def test_alibaba(tmp_path):
    tr = load_trace(write(tmp_path, ALIBABA, "pods.csv"), "alibaba")
    by = {j.name: j for j in tr.jobs}
    assert [j.name for j in tr.jobs] == ["pod-b", "pod-a", "pod-c", "pod-d", "pod-e"]
    assert tr.jobs[0].submit_time == 0 and by["pod-e"].submit_time == 350
    # durations from scheduled_time when present, else creation_time; <= 0 clamps to 1 s
    assert by["pod-b"].duration == 990 and by["pod-c"].duration == 300
    assert by["pod-e"].duration == 1.0 and tr.notes == ("1 pods with a duration <= 0 ran for 1 s "
                                                         "instead",)
    assert by["pod-a"].request == Request(gpus=1, cpus_milli=12000, memory_mib=16384)
    assert by["pod-b"].request == Request(gpu_milli=460, cpus_milli=6000, memory_mib=12288,
                                          gpu_models=("V100M16", "V100M32"))
    assert by["pod-c"].request == Request(cpus_milli=8000, memory_mib=30517)
    assert by["pod-d"].request == Request(gpus=8, workers=1, cpus_milli=88000, memory_mib=327680)
    assert [by[n].priority for n in ("pod-a", "pod-b", "pod-c", "pod-d")] == [2, 0, 1, 2]


@pytest.mark.parametrize("row, expected", [
    ("p,1000,1024,one,0,,BE,Running,1,2,1", ":2: num_gpu: expected an integer >= 0, got 'one'"),
    ("p,1000,1024,1,1500,,BE,Running,1,2,1", ":2: gpu_milli: expected 0..1000, got '1500'"),
    ("p,1000,1024,1,500,V999,BE,Running,1,2,1", ":2: gpu_spec: unknown GPU model 'V999'"),
    ("p,1000,1024,1,500,,Gold,Running,1,2,1", ":2: qos: expected one of LS"),
    ("p,1000,1024,1,500,,BE,Running,,2,1", ":2: creation_time: expected a number, got ''"),
])
def test_alibaba_bad_rows(tmp_path, row, expected):
    path = write(tmp_path, ALIBABA.splitlines()[0] + "\n" + row + "\n", "pods.csv")
    assert path + expected in trace_error(path, "alibaba")


def test_alibaba_missing_time_columns(tmp_path):
    # the multigpu variants of the real pod lists have no times: say which column is missing
    path = write(tmp_path, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1000\n", "m.csv")
    assert f"{path}:1: missing required column 'creation_time'" in trace_error(path, "alibaba")


# --- generic CSV, formats, windows --------------------------------------------------------------

def test_generic_csv(tmp_path):
    tr = load_trace(write(tmp_path, GENERIC, "jobs.csv"), "csv")
    assert [j.name for j in tr.jobs] == ["j2", "j1", "j3"] and tr.format == "csv"
    j2, j1, j3 = tr.jobs
    assert j2.request == Request(gpu_milli=250, gpu_models=("T4", "V100"))
    assert j2.tenant == "default"
    assert j1.request == Request(gpus=1, workers=2) and j1.submit_time == 90
    assert j1.tenant == "alice"
    assert j3.request == Request(gpus=1, gpu_models=("A100",)) and j3.duration == 5.5


def test_generic_csv_job_type_column(tmp_path):
    text = ("job_id,submit_time,duration,num_gpus,job_type\n"
            "a,0,10,1,ResNet-50 (batch size 64)\n"
            "b,5,10,2,\n"
            "c,9,10,1\n")
    tr = load_trace(write(tmp_path, text, "typed.csv"), "csv")
    assert [j.job_type for j in tr.jobs] == ["ResNet-50 (batch size 64)", "", ""]
    # A window keeps the types, and writing the trace back keeps them too.
    assert [j.job_type for j in apply_window(tr, "5:").jobs] == ["", ""]
    out = str(tmp_path / "again.csv")
    write_csv(tr.jobs, out)
    assert [j.job_type for j in load_trace(out, "csv").jobs] == [j.job_type for j in tr.jobs]


def test_generic_csv_minimal_columns(tmp_path):
    tr = load_trace(write(tmp_path, "job_id,submit_time,duration,num_gpus\na,0,1,3\n", "j.csv"),
                    "csv")
    assert tr.jobs[0].request == Request(gpus=1, workers=3)


@pytest.mark.parametrize("row, expected", [
    ("a,0,-5,1", ":2: duration: expected a positive number, got '-5'"),
    ("a,soon,5,1", ":2: submit_time: expected a number, got 'soon'"),
    ("a,0,5,2,,500,", ":2: gpu_milli: a fraction (500) needs num_gpus 1, got 2"),
    ("a,0,5,1,,,Z80", ":2: gpu_model: unknown GPU model 'Z80'"),
    ("a,0,5,1.5", ":2: num_gpus: expected a positive integer, got '1.5'"),
])
def test_generic_csv_bad_rows(tmp_path, row, expected):
    path = write(tmp_path, "job_id,submit_time,duration,num_gpus,tenant,gpu_milli,gpu_model\n"
                 + row + "\n", "jobs.csv")
    assert path + expected in trace_error(path, "csv")


def test_encoding(tmp_path):
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfjob_id,submit_time,duration,num_gpus\na,0,1,1\n")
    assert load_trace(str(bom), "csv").jobs[0].name == "a"
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"job_id,submit_time,duration,num_gpus\na,0,1,1\nb,\xff,1,1\n")
    assert f"{binary}:3: not UTF-8 text" in trace_error(str(binary), "csv")


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(SpecError, match="unknown trace format 'helios'; choose one of: philly, "
                                        "alibaba, csv"):
        load_trace("x.csv", "helios")
    assert "no-such.csv:0: cannot read trace" in trace_error(str(tmp_path / "no-such.csv"), "csv")


@pytest.mark.parametrize("text, expected", [
    ("0d:14d", (0.0, 14 * 86400.0)), ("3600:86400", (3600.0, 86400.0)),
    ("2h:", (7200.0, math.inf)), (":30m", (0.0, 1800.0)), ("1.5h:2h", (5400.0, 7200.0)),
    (" 10s : 1m ", (10.0, 60.0)),
])
def test_parse_window(text, expected):
    assert parse_window(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("14d", "expected START:END"), ("1w:2w", "cannot read '1w'"), ("2h:1h", "must be after"),
    ("-1h:2h", "cannot read '-1h'"), ("1:2:3", "expected START:END"), ("5:5", "must be after"),
])
def test_bad_window(text, expected):
    with pytest.raises(SpecError, match=expected) as e:
        parse_window(text)
    assert repr(text) in str(e.value)


def test_window_selects_and_rebases(tmp_path):
    path = write(tmp_path, GENERIC + "j4,4000,1,1\nj5,7210,1,1\n", "jobs.csv")
    tr = load_trace(path, "csv", window="60:1h")  # trace times 0, 90, 90, 3990, 7200
    assert [j.name for j in tr.jobs] == ["j1", "j3"] and [j.id for j in tr.jobs] == [0, 1]
    assert [j.submit_time for j in tr.jobs] == [0.0, 0.0] and "kept 2 of 5" in tr.notes[-1]
    tail = load_trace(path, "csv", window="1h:")
    assert [(j.name, j.submit_time) for j in tail.jobs] == [("j4", 0.0), ("j5", 3210.0)]
    full = load_trace(path, "csv")
    apply_window(full, (60.0, 3600.0))
    assert full.jobs[1].submit_time == 90 and full.jobs[1].id == 1  # the input is left alone
    with pytest.raises(SpecError, match="selects no jobs"):
        load_trace(path, "csv", window="2d:3d")
    with pytest.raises(SpecError, match="window 'xx'"):  # checked before the file is read
        load_trace(str(tmp_path / "absent.csv"), "csv", window="xx")


# --- synthetic ----------------------------------------------------------------------------------

def _key(jobs):
    return [(j.id, j.submit_time, j.duration, j.request, j.tenant, j.name) for j in jobs]


def test_synthetic_deterministic_and_seeded():
    a = synthetic_jobs(500, seed=7, fractional=0.3)
    assert _key(a) == _key(synthetic_jobs(500, seed=7, fractional=0.3))
    assert _key(a) != _key(synthetic_jobs(500, seed=8, fractional=0.3))


def test_synthetic_shape():
    jobs = synthetic_jobs(4000, seed=1, load=0.7, cluster_gpus=32, tenants=4, fractional=0.2)
    assert [j.id for j in jobs] == list(range(4000)) and jobs[0].submit_time == 0
    assert all(a.submit_time <= b.submit_time for a, b in zip(jobs, jobs[1:], strict=False))
    gangs = np.array([j.request.workers for j in jobs if not j.request.fractional])
    assert gangs.max() <= 32 and np.mean(gangs == 1) > 0.6 and {2, 4, 8} <= set(gangs.tolist())
    frac = [j.request for j in jobs if j.request.fractional]
    assert 0.15 < len(frac) / len(jobs) < 0.25
    assert all(100 <= r.gpu_milli <= 900 and 1024 <= r.gpu_memory_mib <= 15 * 1024 for r in frac)
    assert {j.tenant for j in jobs} == {"team-0", "team-1", "team-2", "team-3"}
    d = np.array([j.duration for j in jobs])
    assert np.median(d) < np.mean(d) / 2 and d.max() > 50 * np.median(d)  # heavy tail
    demand = sum(j.request.num_gpus * j.duration for j in jobs)
    offered = demand / (jobs[-1].submit_time * 32)
    assert 0.5 < offered < 1.0  # about the asked load of 0.7
    small = synthetic_jobs(300, seed=2, cluster_gpus=4)
    assert max(j.request.num_gpus for j in small) <= 4


def test_synthetic_bad_options():
    for kw in ({"load": 0}, {"cluster_gpus": 0}, {"tenants": 0}, {"fractional": 1.5}):
        with pytest.raises(SpecError, match="synthetic"):
            synthetic_jobs(10, seed=0, **kw)


def test_synthetic_csv_round_trip(tmp_path):
    jobs = synthetic_jobs(300, seed=3, fractional=0.25, heavy_tail=False)
    path = str(tmp_path / "syn.csv")
    write_csv(jobs, path)
    back = load_trace(path, "csv")
    assert _key(back.jobs) == _key(jobs)
    assert synthetic_trace(300, seed=3, fractional=0.25, heavy_tail=False).jobs[5].request == \
        jobs[5].request


def test_write_csv_refuses_what_it_cannot_express(tmp_path):
    job = synthetic_jobs(1, seed=0)[0]
    job.request = Request(gpus=2, workers=2)
    with pytest.raises(SpecError, match="job 0"):
        write_csv([job], str(tmp_path / "x.csv"))


# --- the real traces, where this machine has them -----------------------------------------------

DATA = str(Path(__file__).resolve().parents[3] / "shared/data/traces")


@pytest.mark.skipif(not os.path.exists(f"{DATA}/philly/philly.csv"), reason="no Philly trace")
def test_real_philly_loads():
    tr = load_trace(f"{DATA}/philly/philly.csv", "philly")
    assert len(tr.jobs) == 82_247 and tr.jobs[0].submit_time == 0
    assert all(a.submit_time <= b.submit_time for a, b in zip(tr.jobs, tr.jobs[1:]))


@pytest.mark.skipif(not os.path.exists(f"{DATA}/alibaba-gpu-2023/openb_pod_list_default.csv"),
                    reason="no Alibaba trace")
def test_real_alibaba_loads():
    tr = load_trace(f"{DATA}/alibaba-gpu-2023/openb_pod_list_default.csv", "alibaba")
    assert len(tr.jobs) == 8152 and any(j.request.fractional for j in tr.jobs)
