"""CPU and memory limits: which mechanism is in force, and that a worker over its limit fails."""

from __future__ import annotations

import os

import pytest
from conftest import PY, spec, wait_events

from plinth.runtime import WorkerLaunch
from plinth.runtime.limits import Limiter, cgroup_quota

ALLOC = "import sys; b = bytearray(int(sys.argv[1]) * 2**20); b[::4096] = b'x' * len(b[::4096])"


def _one(memory_mib=0, cpus_milli=0):
    return (WorkerLaunch(0, "localhost", memory_mib=memory_mib, cpus_milli=cpus_milli),)


def test_isolation_is_reported(make_rt):
    rt = make_rt()
    assert rt.isolation in ("cgroup2", "rlimit")
    assert f"isolation: {rt.isolation}" in rt.describe()


def test_worker_over_its_memory_limit_fails(make_rt, tmp_path):
    rt = make_rt()
    rt.launch(spec(tmp_path, (PY, "-c", ALLOC, "1024"), worker_list=_one(memory_mib=256)))
    [ev] = wait_events(rt)
    assert ev.exit_code != 0
    rt.launch(spec(tmp_path, (PY, "-c", ALLOC, "64"), worker_list=_one(memory_mib=256),
                   attempt=2))
    [ev] = wait_events(rt)
    assert ev.exit_code == 0  # the limit is what failed the first one


def test_torch_runs_under_a_generous_memory_limit(make_rt, tmp_path):
    rt = make_rt()
    prog = "import torch; x = torch.ones(512, 512); print(float((x @ x).sum()))"
    rt.launch(spec(tmp_path, (PY, "-c", prog), worker_list=_one(memory_mib=1024)))
    [ev] = wait_events(rt)
    assert ev.exit_code == 0, (tmp_path / "job.log").read_text()


def test_cpu_share_pins_to_that_many_cpus(make_rt, tmp_path):
    rt = make_rt()
    if rt.isolation != "rlimit":
        pytest.skip("cgroup2 limits CPU time with cpu.max, not with affinity")
    out = tmp_path / "cpus"
    prog = "import os, sys; open(sys.argv[1], 'w').write(str(len(os.sched_getaffinity(0))))"
    rt.launch(spec(tmp_path, (PY, "-c", prog, str(out)), worker_list=_one(cpus_milli=500)))
    [ev] = wait_events(rt)
    assert ev.exit_code == 0 and out.read_text() == "1"


def test_cpu_picks_spread_over_the_machine():
    lim = Limiter()
    cpus = sorted(os.sched_getaffinity(0))
    if lim.mechanism != "rlimit" or len(cpus) < 2:
        pytest.skip("needs the rlimit path and two CPUs")
    a = lim.prepare("a", cpus_milli=1000, memory_mib=0)
    b = lim.prepare("b", cpus_milli=1000, memory_mib=0)
    assert a.cpus != b.cpus and len(a.cpus) == len(b.cpus) == 1
    lim.release(a)
    assert lim.prepare("c", cpus_milli=1000, memory_mib=0).cpus == a.cpus


def test_cgroup_files_for_a_worker(tmp_path):
    # A plain directory stands in for a delegated cgroup2 parent: the files the kernel would
    # enforce are written as they would be.
    lim = Limiter(cgroup_parent=tmp_path)
    assert lim.mechanism == "cgroup2"
    w = lim.prepare("j1-a1-r0", cpus_milli=1500, memory_mib=256)
    cg = tmp_path / "plinth" / "j1-a1-r0"
    assert w.cgroup == str(cg) and w.shim_args() == ["--cgroup", str(cg)]
    assert (cg / "cpu.max").read_text() == "150000 100000"
    assert (cg / "memory.max").read_text() == str(256 * 2**20)
    assert (tmp_path / "plinth" / "cgroup.subtree_control").read_text() == "+cpu +memory"


def test_cgroup_quota():
    assert cgroup_quota(1000) == "100000 100000"
    assert cgroup_quota(250) == "25000 100000"
