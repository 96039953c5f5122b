"""Launches across real hosts: the multi-host bed (tests/hosts: network namespaces, a private
/tmp each, 198.18.0.0/24) against the 2-node Ray cluster on 127.0.0.1, in the same run.

    .venv/bin/python bench/hosts_launch.py [--jobs 100] [--deaths 3] [--json FILE]   (as root)

Three measures:
- launch latency, from the scheduler's decision (the call to `launch`) to the worker's process
  running, for `--jobs` single-GPU jobs (waves of 8, as bench/ray_launch.py) and for one
  8-worker gang across two hosts, with the control plane's CPU per launch. The same code runs
  against both clusters of 2 nodes x 4 fake A100s: on the bed from inside h1 (the Ray head's
  host, where the control plane runs), and on 127.0.0.1 from this process.
- the control loop's turn while `--jobs` launches are on their way (launches run off the loop):
  a control plane on the bed's Ray gets `--jobs` CPU jobs at once; each turn's wall time,
  with how many launches were in flight, against turns with none.
- time from a host's death (every process in its namespace killed) to its job running on
  the other host, `--deaths` times, with `plinth up` on h1 (the host boots again after each).
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

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "tests" / "hosts"))
sys.path.insert(0, str(HERE.parents[1] / "tests" / "runtime"))
sys.path.insert(0, str(HERE.parent))


def inside(address: str, nodes: list[str], out_dir: Path, jobs: int, loop: bool) -> dict:
    """Run where the control plane would (h1 on the bed): the launch figures, and the loop's
    turns while launches are on their way."""
    import ray_launch

    from plinth.runtime.ray import RayRuntime

    tempfile.tempdir = str(out_dir)  # the workers' stamps must be on the shared folder
    rt = RayRuntime(address)
    row = ray_launch.measure("ray", rt, nodes, jobs)
    rt.close()
    if loop:
        row |= loop_turns(address, out_dir, jobs)
    return row


def loop_turns(address: str, out_dir: Path, jobs: int) -> dict:
    from plinth.control.service import ControlPlane
    from plinth.control.store import Store
    from plinth.core.jobspec import JobSpec, Resources
    from plinth.runtime.ray import RayRuntime

    home = Path(tempfile.mkdtemp(prefix="loop-", dir=out_dir))
    store = Store(str(home / "plinth.db"))
    store.put_tenant("default", None, None)
    cp = ControlPlane(store, RayRuntime(address), home=home)
    turns: list[tuple[int, float]] = []  # (launches in flight at its start, seconds)
    step = cp.loop.step

    def timed() -> None:
        n, t0 = cp.driver.launching, time.perf_counter()
        step()
        turns.append((n, time.perf_counter() - t0))

    cp.loop.step = timed  # type: ignore[method-assign]
    cp.start()
    try:
        ids = [cp.submit(JobSpec(name=f"l{i}", resources=Resources(cpus=0.02, memory=32),
                                 command=["sleep", "1"]), "default") for i in range(jobs)]
        end = time.monotonic() + 900
        while not all((store.job(i) or {}).get("end_time") for i in ids):
            if time.monotonic() > end:
                raise SystemExit("the loop jobs did not end in 900 s")
            time.sleep(0.2)
    finally:
        cp.close()
    busy = [t for n, t in turns if n > 0]
    idle = [t for n, t in turns if n == 0]
    return {"loop_turns_busy": len(busy), "loop_peak_inflight": max(n for n, _ in turns),
            "loop_busy_p50_ms": 1e3 * statistics.median(busy) if busy else None,
            "loop_busy_max_ms": 1e3 * max(busy) if busy else None,
            "loop_idle_p50_ms": 1e3 * statistics.median(idle) if idle else None,
            "loop_idle_max_ms": 1e3 * max(idle) if idle else None}


def on_bed(jobs: int, deaths: int) -> tuple[dict, list[float]]:
    from cluster import PlinthBed, Worker

    pb = PlinthBed(workers=(Worker("h2", gpus=4, rack="r2"), Worker("h3", gpus=4, rack="r3")))
    try:
        pb.up(plane=False)
        out = pb.shared / "bench"
        out.mkdir(mode=0o777)
        done = pb.bed.sh("h1", [sys.executable, str(HERE), "--inside", "--ray-address",
                                f"{pb.head}:6379", "--nodes", "h2,h3", "--dir", str(out),
                                "--jobs", str(jobs)], env=pb.env, timeout=3600)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        pb.start_plane()
        return row, [host_death(pb, i) for i in range(deaths)]
    finally:
        pb.down()


def host_death(pb, i: int) -> float:
    """Seconds from killing the host of a running job to the job's first beat elsewhere."""
    from cluster import Worker
    from test_faults import _beats

    beats = pb.shared / f"death{i}.beats"
    beats.touch()
    beats.chmod(0o666)
    spec = pb.shared / f"death{i}.yaml"
    spec.write_text(f"name: death{i}\ncommand: [sh, -c, 'while :; do echo $PLINTH_ATTEMPT "
                    f"$(hostname) $(date +%s.%N) >> {beats}; sleep 0.1; done']\n"
                    "resources: {cpus: 1}\n")
    pb.cli("h1", "submit", str(spec))
    host = _until(lambda: _beats(beats), 120)[0][1]
    t0 = time.time()
    pb.bed.kill_host(host)
    t1 = _until(lambda: [t for a, _, t in _beats(beats) if a == 2], 300)[0]
    pb.cli("h1", "cancel", _job_id(pb, f"death{i}"))
    pb.join(Worker(host, gpus=4, rack=f"r{host[1:]}"))
    _until(lambda: f"\n {host} " in pb.cli("h1", "nodes").stdout, 300)
    return t1 - t0


def _job_id(pb, name: str) -> str:
    jobs = json.loads(pb.cli("h1", "ls", "-o", "json").stdout)
    return str(next(j["id"] for j in jobs if j["name"] == name))


def _until(cond, timeout: float):
    end = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() > end:
            raise SystemExit(f"timed out after {timeout:g} s")
        time.sleep(0.05)
    return v


def on_loopback(jobs: int) -> dict:
    from ray_cluster import LocalRayCluster  # sets Ray's loopback switch before Ray loads
    from ray_launch import NODES

    cluster = LocalRayCluster(NODES)
    out = Path(tempfile.mkdtemp(prefix="hosts-launch-lo-"))
    try:
        return inside(cluster.address, [n.name for n in NODES], out, jobs, loop=False)
    finally:
        cluster.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--deaths", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ray-address", help=argparse.SUPPRESS)
    ap.add_argument("--nodes", help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        row = inside(args.ray_address, args.nodes.split(","), args.dir, args.jobs, loop=True)
        print(json.dumps(row))
        return
    if os.geteuid() != 0:
        raise SystemExit("the bed makes network namespaces: run as root")
    bed, deaths = on_bed(args.jobs, args.deaths)
    lo = on_loopback(args.jobs)
    print(f"{'cluster':10} {'jobs':>5} {'p50 s':>7} {'p95 s':>7} {'max s':>7} "
          f"{'CPU/launch s':>12} {'gang first s':>12} {'gang last s':>11}")
    for name, r in (("bed", bed), ("127.0.0.1", lo)):
        print(f"{name:10} {r['jobs']:5d} {r['single_p50_s']:7.3f} {r['single_p95_s']:7.3f} "
              f"{r['single_max_s']:7.3f} {r['cpu_per_launch_s']:12.4f} "
              f"{r['gang_first_s']:12.3f} {r['gang_last_s']:11.3f}")
    print(f"control loop on the bed, {args.jobs} jobs at once: {bed['loop_turns_busy']} turns "
          f"with launches in flight (peak {bed['loop_peak_inflight']}): p50 "
          f"{bed['loop_busy_p50_ms']:.1f} ms, max {bed['loop_busy_max_ms']:.1f} ms; turns "
          f"with none: p50 {bed['loop_idle_p50_ms']:.1f} ms, max {bed['loop_idle_max_ms']:.1f} ms")
    if deaths:
        print(f"host death to its job running on the other host ({len(deaths)} runs): "
              f"{', '.join(f'{d:.1f}' for d in deaths)} s (median {statistics.median(deaths):.1f})")
    print(f"load average {Path('/proc/loadavg').read_text().split()[0]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"bed": bed, "loopback": lo, "deaths_s": deaths,
                                         "cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
