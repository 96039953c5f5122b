"""Launch latency, Ray runtime against local runtime: from the scheduler's decision (the call to
`launch`) to the worker's process running (the first thing it does is write the time).

    .venv/bin/python bench/ray_launch.py [--jobs 100] [--json results/ray_launch.json]

Two workloads, on 8 fake A100s both ways: the local runtime with --fake-gpus 8xA100 on this
machine, and a real 2-node Ray cluster on 127.0.0.1 (tests/runtime/ray_cluster.py) of 4 fake
A100s per node.

- `single`: JOBS single-GPU jobs, decided in waves of 8 (one per GPU, as one scheduling pass
  fills the cluster); a wave's jobs are launched one after another, then run to their end
  before the next wave.
- `gang`: one 8-worker gang, 4 workers on each Ray node (on the one local node); latency to its
  first and to its last worker running.
- `wave`: a control plane on the Ray runtime (in this process) carries out one pass that starts
  8 single-GPU jobs at once (they wait behind a job holding every GPU, which is then told to
  end); from that signal to the last of the 8 running, median of `--waves`. Launched one after
  another (the runtime's "concurrent-launch" taken away) and at once (the default), in the same
  run.

Also: the control plane's (this process's) CPU seconds per launch, and the resident memory of the
Ray cluster's processes at rest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))
import psutil
from ray_cluster import LocalRayCluster, NodeSpec  # before Ray: sets its loopback switch

from plinth.runtime import EventKind, LaunchSpec, LocalRuntime, WorkerLaunch

GPUS_PER_NODE = 4
NODES = (NodeSpec("ray-head", GPUS_PER_NODE, 4, "r0"), NodeSpec("ray-worker", GPUS_PER_NODE, 4, "r1"))
# The worker's first act: write the wall clock (date is faster to start than Python).
STAMP = "date +%s.%N > {out}"


def run_waves(rt, nodes: list[str], tmp: Path, jobs: int, first_id: int) -> list[float]:
    """Latency of each of `jobs` single-GPU jobs, in waves of one job per GPU."""
    slots = [(n, g) for n in nodes for g in range(8 // len(nodes))]
    out: list[float] = []
    job_id = first_id
    while len(out) < jobs:
        wave = []
        for node, gpu in slots[:jobs - len(out)]:
            stamp = tmp / f"{job_id}.t"
            t0 = time.time()
            rt.launch(LaunchSpec(job_id, 1, ("/bin/sh", "-c", STAMP.format(out=stamp)),
                                 (WorkerLaunch(0, node, gpus=(gpu,)),), str(tmp / "log")))
            wave.append((job_id, t0, [stamp]))
            job_id += 1
        out += [max(lat) for lat in finish(rt, wave)]
    return out


def run_gang(rt, nodes: list[str], tmp: Path, job_id: int) -> list[float]:
    per = 8 // len(nodes)
    ws = tuple(WorkerLaunch(r, nodes[r // per], gpus=(r % per,)) for r in range(8))
    stamps = [tmp / f"{job_id}.{r}.t" for r in range(8)]
    t0 = time.time()
    cmd = STAMP.format(out=str(tmp / f"{job_id}.$RANK.t"))
    rt.launch(LaunchSpec(job_id, 1, ("/bin/sh", "-c", cmd), ws, str(tmp / "log")))
    return finish(rt, [(job_id, t0, stamps)])[0]


def finish(rt, wave) -> list[list[float]]:
    """Wait for every job of `wave` to end; each job's latencies, one per worker."""
    left = {job_id for job_id, _, _ in wave}
    end = time.monotonic() + 300
    while left:
        for ev in rt.poll():
            if ev.kind in (EventKind.EXITED, EventKind.LOST):
                if ev.exit_code != 0:
                    raise SystemExit(f"job {ev.job_id} ended badly: {ev}")
                left.discard(ev.job_id)
        if time.monotonic() > end:
            raise SystemExit(f"jobs {sorted(left)} did not end in 300 s")
        time.sleep(0.01)
    return [[float(s.read_text()) - t0 for s in stamps] for _, t0, stamps in wave]


def run_control_waves(address: str, concurrent: bool, waves: int) -> list[float]:
    """Seconds from the holder's signal to the last of 8 jobs of one pass running, per wave."""
    from plinth.control.service import ControlPlane
    from plinth.core.jobspec import JobSpec, Resources
    from plinth.control.store import Store
    from plinth.runtime.ray import RayRuntime

    tmp = Path(tempfile.mkdtemp(prefix="ray-launch-wave-"))
    rt = RayRuntime(address)
    if not concurrent:  # this instance only: the control plane then launches one at a time
        rt.capabilities = rt.capabilities - {"concurrent-launch"}
    store = Store(str(tmp / "plinth.db"))
    store.put_tenant("default", None, None)
    cp = ControlPlane(store, rt, home=tmp)
    cp.start()
    small = {"cpus": 0.1, "memory": 64}
    out = []
    try:
        for w in range(waves):
            go = tmp / f"go{w}"
            holder = cp.submit(JobSpec(name="holder", workers=8, resources=Resources(
                gpus=1, **small), command=["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; "
                                                       "done"]), "default")
            _until(lambda: store.job(holder)["state"] == "running")
            stamps = [tmp / f"w{w}.{i}.t" for i in range(8)]
            ids = [cp.submit(JobSpec(name=f"w{w}.{i}", resources=Resources(gpus=1, **small),
                                     command=["sh", "-c", STAMP.format(out=s)]), "default")
                   for i, s in enumerate(stamps)]
            time.sleep(1)  # every job is in the owner's queue before the GPUs free up
            t0 = time.time()
            go.touch()
            _until(lambda: all((store.job(i) or {}).get("end_time") for i in ids))
            if any(store.job(i)["state"] != "succeeded" for i in ids):
                raise SystemExit(f"wave {w}: {[store.job(i)['reason'] for i in ids]}")
            out.append(max(float(s.read_text()) for s in stamps) - t0)
    finally:
        cp.close()  # closes the runtime too
    return out


def _until(done, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            raise SystemExit(f"timed out after {timeout:g} s")
        time.sleep(0.02)


def measure(name: str, rt, nodes: list[str], jobs: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"ray-launch-{name}-"))
    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])
    single = run_waves(rt, nodes, tmp, jobs, 9000)
    cpu = sum(me.cpu_times()[:2]) - cpu0
    gang = run_gang(rt, nodes, tmp, 9999)
    return {"runtime": name, "jobs": jobs, "single_p50_s": statistics.median(single),
            "single_p95_s": sorted(single)[int(0.95 * (len(single) - 1))],
            "single_max_s": max(single), "cpu_per_launch_s": cpu / jobs,
            "gang_first_s": min(gang), "gang_last_s": max(gang)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--waves", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="ray-launch-local-"))
    local = LocalRuntime(home, fake_gpus="8xA100")
    rows = [measure("local", local, ["localhost"], args.jobs)]
    local.close()

    from plinth.runtime.ray import RayRuntime

    waves: dict[bool, list[float]] = {}
    cluster = LocalRayCluster(NODES)
    try:
        time.sleep(5)  # let the nodes settle before the memory at rest is read
        rss = sum(psutil.Process(p).memory_info().rss for p in cluster.pids()
                  if psutil.pid_exists(p))
        rt = RayRuntime(cluster.address)
        rows.append(measure("ray", rt, [n.name for n in NODES], args.jobs))
        rows[-1]["cluster_rss_mib_at_rest"] = rss / 2**20
        rt.close()
        for concurrent in (False, True):
            waves[concurrent] = run_control_waves(cluster.address, concurrent, args.waves)
    finally:
        cluster.shutdown()

    print(f"{'runtime':8} {'jobs':>5} {'p50 s':>7} {'p95 s':>7} {'max s':>7} "
          f"{'CPU/launch s':>12} {'gang first s':>12} {'gang last s':>11}")
    for r in rows:
        print(f"{r['runtime']:8} {r['jobs']:5d} {r['single_p50_s']:7.3f} {r['single_p95_s']:7.3f} "
              f"{r['single_max_s']:7.3f} {r['cpu_per_launch_s']:12.4f} {r['gang_first_s']:12.3f} "
              f"{r['gang_last_s']:11.3f}")
    print(f"Ray cluster (2 nodes) resident memory at rest: "
          f"{rows[-1]['cluster_rss_mib_at_rest']:.0f} MiB")
    print(f"one pass of 8 single-GPU jobs through the control plane on Ray, signal to the last "
          f"running ({args.waves} waves): one after another median "
          f"{statistics.median(waves[False]):.2f} s (max {max(waves[False]):.2f}), at once "
          f"median {statistics.median(waves[True]):.2f} s (max {max(waves[True]):.2f})")
    print(f"load average {Path('/proc/loadavg').read_text().split()[0]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "cpus": os.cpu_count(),
                                         "wave_serial_s": waves[False],
                                         "wave_concurrent_s": waves[True]}, indent=2))


if __name__ == "__main__":
    main()
