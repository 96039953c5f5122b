"""A platform run as a trace the simulator replays, and how well the replay predicts the run.

`plinth export` (`plinth.cli.export`) reads the control plane's jobs and their event logs and
writes three files, as `sacct` reads Slurm's accounting:

- the trace, in the generic CSV format (`plinth.sim.traces.csv`, written by its `write_csv`):
  per job its submit time (relative to the first exported submission), its request, tenant,
  and its measured run time as `duration`. `job_id` is the platform's job id, so a replayed job
  can be matched to the one that ran. `job_type` is `fixed`: the run time was measured on the
  platform's own GPUs, so the replay must not rescale it by a GPU model's speed.
- the cluster (`--cluster-out`), as the YAML `plinth.core.spec.load_cluster` reads: the nodes
  `/v1/nodes` reports, with the tenants' GPU quotas as the control plane applies them.
- a sidecar JSON (`--meta-out`): the policy, its options and the `SchedConfig` the platform
  scheduled with; per job what the CSV format has no column for (priority, preemptible, the
  run-time estimate, CPUs and memory per worker, the job's name) and what the platform measured
  (first start, end, attempts, run time over all attempts), so a replay can be scored against
  the run without the store.

Measured run time. An attempt runs from the scheduler's start decision (its `started` event) to
the event that ends it (`succeeded`, `failed`, `timeout`, `cancelled`, `preempted`, `lost`,
`retry`): the time the scheduler's plan held its resources, which is what the policy sees. It
is the launch-to-exit time plus, for a job started on GPUs that a preempted job still held, the
wait for that job to exit (its `launched` event comes later; see the sidecar's `runs`). The
simulated runtime stops a job at once, so without the wait in the run time a replay would end
such jobs early, by the platform's stop latency each time.

Restarts. A job that never reported a checkpoint restarts from scratch, so its run time is its
last attempt's: earlier attempts were work lost, and the replay (`checkpoint_interval` = never)
loses them in the same way if it preempts the job too. A job that reported checkpoints resumed
where it stopped, so its run time is the sum over its attempts (exact when it saved on SIGTERM,
as the job SDK does). The sum over attempts is in the sidecar either way (`run_time_total`).

Which jobs. Every job that ran and ended: succeeded, and also failed, timed-out and cancelled
after it ran, because they held GPUs for that long and a replay without them would give the
others an emptier cluster (the sidecar keeps each one's `state`). Left out, each with a note:
jobs not finished, jobs that never ran (cancelled while pending), and requests the CSV format
cannot express (a gang of multi-GPU workers, a fractional gang, a CPU-only job).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plinth.control.tenants import policy_options as platform_policy_options
from plinth.core.errors import SpecError
from plinth.core.jobspec import DEFAULT_ESTIMATE_S, JobSpec
from plinth.core.lifecycle import State
from plinth.core.resources import Cluster, Node, Request
from plinth.core.spec import TRUSTED
from plinth.core.throughput import FIXED_SPEED
from plinth.core.workload import Job
from plinth.sched.quota import platform_quotas
from plinth.sched.types import SchedConfig

META_FORMAT = "plinth-export/1"
# `plinth up`'s defaults (--min-runtime, --round): what a platform runs with unless told otherwise.
PLATFORM_MIN_RUNTIME_S = 30.0
PLATFORM_ROUND_S = 360.0
# The `SchedConfig` fields a sidecar may set (the placement and throughputs are the defaults).
NUMERIC_CONFIG = ("min_runtime", "preempt_backoff", "max_preemptions", "backfill_depth",
                  "restore_overhead", "checkpoint_interval", "round_s")
# Events that end an attempt (the processes are gone and the resources released).
RUN_ENDS = frozenset({"succeeded", "failed", "timeout", "cancelled", "preempted", "lost",
                      "retry", "launch-failed", "launch-retry"})


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a job, in wall-clock seconds: the scheduler's start decision (from when the
    plan holds its resources), its launch (later only when it waited for a stopping job to
    release them), and the event that ended it."""

    start: float
    launch: float
    end: float
    ended_by: str

    @property
    def run_time(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class MeasuredJob:
    """One exported job: the trace's `Job` and what the platform measured (times relative to
    the first exported submission)."""

    job: Job  # id = trace index, name = the platform's job id, duration = measured run time
    platform_id: int
    name: str  # the user's job name
    state: str  # how it ended on the platform
    runs: tuple[Attempt, ...]  # relative to the first exported submission
    checkpointed: bool
    preemptions: int

    @property
    def first_start(self) -> float:
        """The first start decision (what the simulator records as `first_start`)."""
        return self.runs[0].start

    @property
    def end(self) -> float:
        return self.runs[-1].end

    @property
    def run_time_total(self) -> float:
        """Every attempt's run time: what the job held, work lost to preemption included."""
        return sum(a.run_time for a in self.runs)


@dataclass(frozen=True, slots=True)
class Export:
    jobs: list[MeasuredJob]
    left_out: list[str]  # one note per job not exported
    t0: float  # wall-clock time of the first exported submission


def attempts(events: Iterable[Mapping[str, Any]]) -> list[Attempt]:
    """A job's attempts from its event log (in log order)."""
    out: list[Attempt] = []
    start = launch = None
    for e in events:
        kind, t = e["kind"], float(e["time"])
        if kind == "started":
            start = launch = t
        elif kind == "launched" and start is not None:
            launch = t
        elif kind in RUN_ENDS and start is not None:
            out.append(Attempt(start, launch, t, kind))  # type: ignore[arg-type]
            start = launch = None
    return out


def expressible(req: Request) -> str | None:
    """Why the CSV trace format cannot hold `req`, or None if it can."""
    if req.fractional:
        return None if req.workers == 1 else f"a fractional gang ({req.workers} workers)"
    if req.gpus == 1:
        return None
    if req.gpus == 0:
        return "a CPU-only job"
    return f"{req.gpus} GPUs per worker (the format means one-GPU workers)"


def build_export(records: Iterable[Mapping[str, Any]]) -> Export:
    """Jobs as `GET /v1/workloads/{id}` returns them (spec and events; for a job not finished the
    summary is enough) -> the exported jobs, oldest submission first."""
    left_out: list[str] = []
    kept: list[tuple[Mapping[str, Any], JobSpec, list[Attempt]]] = []
    for r in sorted(records, key=lambda r: (r["submit_time"], r["id"])):
        state = State(r["state"])
        where = f"job {r['id']} ({r['name']}, {state.value})"
        if not state.terminal:
            left_out.append(f"{where}: not finished")
            continue
        runs = attempts(r["events"])
        if not runs:
            left_out.append(f"{where}: never ran")
            continue
        spec = JobSpec.model_validate(r["spec"], context=TRUSTED)  # the store's: accepted once
        why = expressible(spec.request())
        if why is not None:
            left_out.append(f"{where}: the CSV trace format cannot express {why}")
            continue
        kept.append((r, spec, runs))
    if not kept:
        return Export([], left_out, 0.0)
    t0 = float(kept[0][0]["submit_time"])
    jobs = []
    for r, spec, runs in kept:
        checkpointed = r.get("checkpoint_step") is not None
        total = sum(a.run_time for a in runs)
        run_time = total if checkpointed else runs[-1].run_time
        if run_time <= 0:
            left_out.append(f"job {r['id']} ({r['name']}, {r['state']}): ran for 0 s")
            continue
        platform = spec.job(r["id"], r["tenant"], float(r["submit_time"]) - t0)
        # The platform plans a job without a max_runtime as if it ran DEFAULT_ESTIMATE_S
        # (`JobSpec.job`). The replay gets that estimate as its time limit, so that its
        # policy plans with the same numbers; past the measured run, since none stopped it.
        limit = spec.max_runtime or max(DEFAULT_ESTIMATE_S, math.ceil(run_time) + 1.0)
        job = dataclasses.replace(platform, id=len(jobs), duration=run_time, name=str(r["id"]),
                                  job_type=FIXED_SPEED, time_limit=limit)
        rel = tuple(Attempt(a.start - t0, a.launch - t0, a.end - t0, a.ended_by) for a in runs)
        jobs.append(MeasuredJob(job=job, platform_id=int(r["id"]), name=spec.name,
                                state=r["state"], runs=rel, checkpointed=checkpointed,
                                preemptions=int(r.get("preemptions") or 0)))
    return Export(jobs, left_out, t0)


# --- the cluster and the scheduler's configuration ----------------------------------------------

def cluster_from_api(nodes: Sequence[Mapping[str, Any]],
                     tenants: Sequence[Mapping[str, Any]] | None) -> Cluster:
    """The cluster a replay runs on, from `/v1/nodes` and `/v1/tenants`."""
    return Cluster(tuple(Node(n["name"], round(float(n["cpus"]) * 1000), int(n["memory_mib"]),
                              n["gpu_model"], int(n["gpus"])) for n in nodes),
                   name="platform",
                   tenants=platform_quotas(tenants or [], sum(int(n["gpus"]) for n in nodes)))


def policy_options(policy: str) -> dict[str, Any]:
    """The options the control plane builds its policy with, beyond the quotas (which are in the
    cluster file)."""
    opts = platform_policy_options(policy, None)
    opts.pop("quotas", None)
    return opts


def replay_config(export: Export, min_runtime: float = PLATFORM_MIN_RUNTIME_S,
                  round_s: float = PLATFORM_ROUND_S) -> dict[str, Any]:
    """The `SchedConfig` a replay schedules with: the platform's (`plinth up` builds
    `SchedConfig(min_runtime=..., round_s=...)`), every number written out so that a later
    change of the defaults does not change the replay. The two fields only the simulated runtime
    reads are
    set to what the platform's jobs did: the measured run times already hold every restart's
    cost, so no restore overhead; and checkpoints as the jobs made them: never if none reported
    one (a stop loses the attempt), at every stop if they all did (mixed: never)."""
    platform = SchedConfig(min_runtime=float(min_runtime), round_s=float(round_s))
    saved = [m.checkpointed for m in export.jobs]
    return {**{f: getattr(platform, f) for f in NUMERIC_CONFIG}, "restore_overhead": 0.0,
            "checkpoint_interval": 0.0 if saved and all(saved) else None}  # None: never


def sched_config(fields: Mapping[str, Any]) -> SchedConfig:
    """A `SchedConfig` from the sidecar's `sched_config` (`checkpoint_interval` null: never)."""
    bad = sorted(set(fields) - set(NUMERIC_CONFIG))
    if bad:
        raise SpecError(f"sched_config: unknown field {bad[0]!r} (known: "
                        f"{', '.join(NUMERIC_CONFIG)})")
    values = dict(fields)
    if "checkpoint_interval" in values and values["checkpoint_interval"] is None:
        values["checkpoint_interval"] = math.inf
    return SchedConfig(**values)


# --- the sidecar ---------------------------------------------------------------------------

def meta(export: Export, *, policy: str, config: Mapping[str, Any], source: str,
         config_source: str) -> dict[str, Any]:
    return {
        "format": META_FORMAT,
        "source": source,
        "t0": export.t0,
        "policy": policy,
        "policy_options": policy_options(policy),
        "sched_config": dict(config),
        "sched_config_source": config_source,
        "run_time": "the last attempt's, from the start decision to the end; summed over "
                    "attempts for a job that reported checkpoints",
        "jobs": [{
            "job_id": m.job.name, "name": m.name, "tenant": m.job.tenant, "state": m.state,
            "priority": m.job.priority, "preemptible": m.job.preemptible,
            "time_limit": m.job.time_limit, "cpus_milli": m.job.request.cpus_milli,
            "memory_mib": m.job.request.memory_mib, "job_type": m.job.job_type,
            "submit": m.job.submit_time, "first_start": m.first_start, "end": m.end,
            "run_time": m.job.duration, "run_time_total": m.run_time_total,
            "preemptions": m.preemptions, "checkpointed": m.checkpointed,
            "runs": [[a.start, a.launch, a.end, a.ended_by] for a in m.runs],
        } for m in export.jobs],
        "left_out": export.left_out,
    }


def read_meta(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise SpecError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != META_FORMAT:
        raise SpecError(f"{path}: not a `plinth export` sidecar (format {META_FORMAT})")
    return data


def replay_jobs(trace_jobs: Sequence[Job], meta_data: Mapping[str, Any]
                ) -> tuple[list[Job], list[str]]:
    """The trace's jobs with what the CSV loader did not read taken from the sidecar (priority,
    preemptible, the platform's estimate as time limit, CPUs and memory, job type). Returns
    the jobs and the fields that the sidecar had to supply, for the report."""
    by_id = {j["job_id"]: j for j in meta_data["jobs"]}
    if sorted(by_id) != sorted(j.name for j in trace_jobs):
        raise SpecError("the sidecar and the trace do not list the same jobs; export them again")
    supplied: set[str] = set()
    out = []
    for job in trace_jobs:
        m = by_id[job.name]
        req = job.request
        want = {"priority": m["priority"], "preemptible": m["preemptible"],
                "time_limit": m["time_limit"], "job_type": m["job_type"]}
        for k, v in want.items():
            if getattr(job, k) != v:
                supplied.add(k)
        if (req.cpus_milli, req.memory_mib) != (m["cpus_milli"], m["memory_mib"]):
            supplied.add("cpus/memory")
            req = dataclasses.replace(req, cpus_milli=m["cpus_milli"], memory_mib=m["memory_mib"])
        out.append(dataclasses.replace(job, request=req, **want))
    return out, sorted(supplied)


@dataclass(frozen=True, slots=True)
class Replay:
    result: Any  # plinth.sim.engine.SimResult
    meta: dict[str, Any]
    supplied: list[str]  # fields the sidecar supplied because the CSV loader did not read them
    config: SchedConfig


def replay(trace: str | Path, meta_path: str | Path, cluster: str | Path, *,
           policy: str | None = None, **config: Any) -> Replay:
    """Simulate an export on its cluster under the policy and `SchedConfig` it recorded (or
    `policy` and `config` fields instead), through the CSV loader `plinth sim` uses."""
    from plinth.core.spec import load_cluster
    from plinth.sched.policies import make_policy
    from plinth.sim.engine import simulate
    from plinth.sim.traces import load_trace

    data = read_meta(meta_path)
    jobs, supplied = replay_jobs(load_trace(str(trace), "csv").jobs, data)
    name = policy or data["policy"]
    options = data["policy_options"] if name == data["policy"] else {}
    cfg = sched_config({**data["sched_config"], **config})
    result = simulate(jobs, load_cluster(str(cluster)), make_policy(name, **options), cfg)
    return Replay(result, data, supplied, cfg)


# --- how well a replay predicts the run ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Fidelity:
    """A replay against the run it replays. Start order: each side's jobs sorted by first start
    (ties, jobs started in one pass, in submission order).

    - `same_order`: the share of jobs that start in the same order, i.e. the longest set of jobs
      whose relative start order is the same on both sides (longest common subsequence), over
      all jobs. A job started out of turn costs one job, not every job it passes.
    - `same_rank`: the share of jobs with the same position in both orders (strict: one job out
      of turn shifts every job between its two positions).
    - `pairwise`: the share of job pairs that start in the same order on both (Kendall-tau-like).
    - `jct_error`: |sim avg JCT - platform avg JCT| / platform avg JCT, over the jobs that
      succeeded on both.
    """

    jobs: int
    same_order: float
    same_rank: float
    pairwise: float
    platform_avg_jct_s: float
    sim_avg_jct_s: float
    jct_error: float
    start_error_s: float  # mean |sim first start - platform first start|
    max_start_error_s: float
    platform_preemptions: int
    sim_preemptions: int

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def start_order_agreement(platform_order: Sequence[str], sim_order: Sequence[str]
                          ) -> tuple[float, float, float]:
    """(same_order, same_rank, pairwise) of two orders of the same jobs (see `Fidelity`)."""
    n = len(platform_order)
    if n == 0 or sorted(platform_order) != sorted(sim_order):
        raise ValueError("the two orders must hold the same jobs")
    pos = {j: i for i, j in enumerate(platform_order)}
    seq = [pos[j] for j in sim_order]
    tails: list[int] = []  # longest increasing subsequence = LCS of two permutations
    for x in seq:
        k = bisect.bisect_left(tails, x)
        tails[k:k + 1] = [x]
    same_rank = sum(i == x for i, x in enumerate(seq)) / n
    s = np.array(seq)
    p = np.arange(n)
    upper = np.triu(np.ones((n, n), dtype=bool), 1)
    agree = (np.sign(p[:, None] - p[None, :]) == np.sign(s[:, None] - s[None, :]))[upper]
    pairwise = float(agree.mean()) if agree.size else 1.0
    return len(tails) / n, same_rank, pairwise


def fidelity(meta_jobs: Sequence[Mapping[str, Any]], sim_jobs: Iterable[Any],
             sim_preemptions: int) -> Fidelity:
    """Score a replay (`SimResult.jobs`, named by platform job id) against the sidecar's jobs."""
    plat = {m["job_id"]: m for m in meta_jobs}
    sim = {js.job.name: js for js in sim_jobs}
    if sorted(plat) != sorted(sim):
        raise ValueError("the replay does not hold the exported jobs")
    submit_rank = {m["job_id"]: i for i, m in enumerate(sorted(
        meta_jobs, key=lambda m: (m["submit"], int(m["job_id"]))))}
    p_order = sorted(plat, key=lambda j: (plat[j]["first_start"], submit_rank[j]))
    s_order = sorted(sim, key=lambda j: (sim[j].first_start, submit_rank[j]))
    same_order, same_rank, pairwise = start_order_agreement(p_order, s_order)
    both = [j for j in plat if plat[j]["state"] == State.SUCCEEDED.value
            and sim[j].status is State.SUCCEEDED]
    p_jct = np.array([plat[j]["end"] - plat[j]["submit"] for j in both])
    s_jct = np.array([sim[j].end_time - sim[j].job.submit_time for j in both])
    p_avg = float(p_jct.mean()) if both else math.nan
    s_avg = float(s_jct.mean()) if both else math.nan
    start_err = np.array([abs(sim[j].first_start - plat[j]["first_start"]) for j in plat])
    return Fidelity(
        jobs=len(plat), same_order=same_order, same_rank=same_rank, pairwise=pairwise,
        platform_avg_jct_s=p_avg, sim_avg_jct_s=s_avg,
        jct_error=abs(s_avg - p_avg) / p_avg if both and p_avg > 0 else math.nan,
        start_error_s=float(start_err.mean()), max_start_error_s=float(start_err.max()),
        platform_preemptions=sum(int(m["preemptions"]) for m in meta_jobs),
        sim_preemptions=sim_preemptions)
