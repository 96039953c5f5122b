"""The control plane: the store, the scheduler and the runtime, tied together by one loop.

The scheduler is the same pure code the simulator drives: each pass builds a `Snapshot` of the
active jobs and applies the `Decisions` it returns. Only the clock (the wall clock here) and the
runtime (real processes) differ. Active jobs are mirrored in memory so that a pass costs no
database reads; every change is written through to the store first, in one transaction per
transition, so a control plane killed at any point restarts with nothing lost (`recover`).

Threads: API handlers call `submit` and `cancel`; one loop thread handles runtime events, time
limits and scheduling passes. They share `_lock`. The loop wakes on a submit, on a runtime event,
at the policy's `wake_at`, and at the next time limit, and otherwise sleeps.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sortedcontainers import SortedKeyList

from plinth.control.lifecycle import State, StopReason, after_stop
from plinth.control.spec import JobSpec
from plinth.control.store import Event, GroupCommit, Store
from plinth.core.errors import PlinthError, SpecError, UnplaceableError
from plinth.core.resources import Allocation, Cluster, Request, TenantQuota, WorkerSlot
from plinth.core.workload import Job
from plinth.runtime.base import EventKind, Handle, LaunchSpec, Runtime, RuntimeEvent, WorkerLaunch
from plinth.sched.placement import never_fits
from plinth.sched.policies import make_policy
from plinth.sched.policies.base import Policy
from plinth.sched.state import ClusterState
from plinth.sched.types import JobState, JobStatus, SchedConfig, Snapshot

log = logging.getLogger("plinth.control")

# Round-based policies move running jobs between GPUs (Resize); the local runtime cannot.
PLATFORM_POLICIES = ("fifo", "sjf", "priority", "drf", "tiresias")
# A job without max_runtime is planned as if it ran this long (backfill needs an estimate).
DEFAULT_ESTIMATE_S = 24 * 3600.0
# Passes are spaced by at least this, or by nine times as long as the last pass took, so that
# under a burst of submissions the scheduler takes at most a tenth of the process's time and each
# pass sees a batch of new jobs (Slurm's sched_min_interval plays the same role). An idle
# cluster is not delayed: the first pass after a quiet spell runs at once.
MIN_PASS_INTERVAL_S = 0.005


class NotFound(PlinthError):
    pass


class Conflict(PlinthError):
    pass


@dataclass(slots=True)
class Record:
    """An active (pending, running or stopping) job, as the control plane keeps it in memory."""

    id: int
    spec: JobSpec
    tenant: str
    state: State
    js: JobState
    attempt: int = 0
    handle: Handle | None = None
    stop_reason: StopReason | None = None
    base_attained: float = 0.0
    base_executed: float = 0.0


def _account(rec: Record, now: float) -> None:
    """Bring a running job's service up to `now`: wall seconds run (its progress, as production
    knows no reference speed) and GPU-seconds attained (Tiresias), over all its runs."""
    js = rec.js
    ran = now - (js.start_time or now)
    js.executed = js.progress = rec.base_executed + ran
    js.attained = rec.base_attained + ran * js.job.request.num_gpus


def allocation_to_json(a: Allocation) -> dict:
    return {"slots": [{"node": s.node, "gpus": list(s.gpus), "milli": s.milli,
                       "gpu_memory_mib": s.gpu_memory_mib} for s in a.slots]}


def allocation_from_json(d: dict) -> Allocation:
    return Allocation(tuple(WorkerSlot(int(s["node"]), tuple(int(g) for g in s["gpus"]),
                                       int(s["milli"]), int(s["gpu_memory_mib"]))
                            for s in d["slots"]))


class ControlPlane:
    def __init__(self, store: Store, runtime: Runtime, *, home: Path, policy: str = "drf",
                 config: SchedConfig | None = None, grace_s: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        if policy not in PLATFORM_POLICIES:
            raise SpecError(f"--policy: {policy!r} is not available on the platform; choose one "
                            f"of {', '.join(PLATFORM_POLICIES)}")
        self.store, self.runtime, self.home = store, runtime, Path(home)
        self.policy_name, self.grace_s, self.clock = policy, grace_s, clock
        self.config = config or SchedConfig(min_runtime=30.0)
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        (self.home / "checkpoints").mkdir(parents=True, exist_ok=True)
        self.nodes = runtime.nodes()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.active: dict[int, Record] = {}
        self.reasons: dict[int, str] = {}
        self._wake_at: float | None = None
        self._dirty = True
        self._incoming: deque[Record] = deque()  # submitted, not yet seen by the loop
        self.writer = GroupCommit(store)
        self._next_pass = 0.0  # monotonic time before which no pass starts
        self._deadlines: dict[int, float] = {}  # running job -> when its max_runtime is up
        self._rebuild()
        self.state = ClusterState(self.cluster)
        self.pending: SortedKeyList = SortedKeyList(key=self.policy.order)

    # --- set-up -------------------------------------------------------------------------------

    def _rebuild(self) -> None:
        """(Re)build the cluster and the policy from the nodes and the tenants' quotas."""
        rows = self.store.tenants()
        quotas = tuple(TenantQuota(r["name"], r["gpus"] or 0.0, r["borrowing_limit"])
                       for r in rows)
        with_quota = any(r["gpus"] is not None for r in rows)
        self.tenant_names = frozenset(r["name"] for r in rows)
        self._never_fits: dict[Request, str | None] = {}  # the nodes are fixed: memoised
        self.cluster = Cluster(tuple(self.nodes), name="local",
                               tenants=quotas if with_quota else ())
        opts: dict = {}
        if self.policy_name == "drf":
            opts = {"quotas": quotas if with_quota else None, "preempt_within_tenant": True}
        self.policy: Policy = make_policy(self.policy_name, **opts)

    def set_tenant(self, name: str, gpus: float | None, borrowing_limit: float | None) -> None:
        with self._lock:
            self.store.put_tenant(name, gpus, borrowing_limit)
            state, pending = self.state, list(self.pending)
            self._rebuild()
            self.state = state  # same nodes: the allocations still hold
            self.state.cluster = self.cluster
            self.pending = SortedKeyList(pending, key=self.policy.order)
            self._poke()

    def start(self) -> None:
        self.recover()
        self._thread = threading.Thread(target=self._loop, name="plinth-scheduler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.writer.close()
        self.runtime.close()

    def recover(self) -> None:
        """Rebuild memory from the store after a (re)start: pending jobs queue again; running
        ones are re-adopted if their processes are still the same, else requeued as lost."""
        now = self.clock()
        for row in self.store.active_jobs():
            spec = JobSpec.model_validate(row["spec"])
            rec = self._record(row["id"], spec, row["tenant"], row["submit_time"])
            rec.attempt, rec.state = row["attempt"], State(row["state"])
            rec.js.preemptions = row["preemptions"]
            self.active[rec.id] = rec
            if rec.state is State.PENDING:
                self.pending.add(rec.js)
                continue
            rec.stop_reason = StopReason(row["stop_reason"]) if row["stop_reason"] else None
            alloc = allocation_from_json(row["allocation"]) if row["allocation"] else None
            req = spec.request()
            if row["handle"] is None or alloc is None or not self.state.fits(alloc, req):
                # Killed between recording the start and launching, or the nodes changed.
                self._requeue(rec, now, "lost", "control plane restarted before the launch was "
                              "recorded" if row["handle"] is None else "allocation no longer fits")
                continue
            self.state.allocate(alloc, req)
            rec.js.status, rec.js.allocation = JobStatus.RUNNING, alloc
            rec.js.start_time = rec.js.first_start = row["start_time"]
            rec.handle = Handle.from_dict(row["handle"])
            if rec.state is State.RUNNING and spec.max_runtime:
                self._deadlines[rec.id] = row["start_time"] + spec.max_runtime
            if self.runtime.adopt(rec.handle):
                self.store.add_events([Event(rec.id, "adopted", "processes still running "
                                             "(pid and start time match)")], now)
                if rec.state is State.STOPPING:
                    self.runtime.stop(rec.id, rec.attempt, self.grace_s)
            # else: the runtime queued an EXITED or LOST event; the loop handles it.

    def _record(self, job_id: int, spec: JobSpec, tenant: str, submit_time: float) -> Record:
        req = spec.request()
        estimate = spec.max_runtime or DEFAULT_ESTIMATE_S
        job = Job(job_id, submit_time, estimate, req, name=spec.name, tenant=tenant,
                  priority=spec.priority, preemptible=spec.preemptible,
                  time_limit=spec.max_runtime)
        return Record(job_id, spec, tenant, State.PENDING,
                      JobState(job, pending_since=submit_time))

    # --- API-facing operations ----------------------------------------------------------------

    def submit(self, spec: JobSpec, tenant: str) -> int:
        """Accept a job: check it, store it, queue it. Returns its id."""
        spec, row, now = self.admit(spec, tenant)
        return self.accepted(self.store.insert_job(row, now), spec, now)

    def admit(self, spec: JobSpec, tenant: str) -> tuple[JobSpec, dict, float]:
        """Check a submission; return the spec as stored, its store row, and the submit time.
        A job that can never fit the cluster is rejected here, with the reason."""
        req = spec.request()
        why = self._never_fits.get(req, "")
        if why == "":
            why = self._never_fits[req] = never_fits(self.cluster, req)
        if why is not None:
            raise UnplaceableError(f"job {spec.name!r} can never run here: {why} "
                                   f"(cluster: {self.cluster.describe()})")
        spec = spec.model_copy(update={"tenant": tenant})
        row = {"name": spec.name, "tenant": tenant, "priority": spec.priority,
               "spec": spec.model_dump(mode="json"), "reason": "queued"}
        return spec, row, self.clock()

    def accepted(self, job_id: int, spec: JobSpec, now: float) -> int:
        """Queue a job the store now holds. It is handed to the loop without taking `_lock`, so
        a submission never waits for a scheduling pass."""
        self._incoming.append(self._record(job_id, spec, spec.tenant or "default", now))
        self._poke()
        return job_id

    def _take_incoming(self) -> None:
        while self._incoming:
            rec = self._incoming.popleft()
            self.active[rec.id] = rec
            self.pending.add(rec.js)

    def cancel(self, job_id: int) -> str:
        """Cancel a job; returns its state afterwards."""
        with self._lock:
            self._take_incoming()
            rec = self.active.get(job_id)
            if rec is None:
                row = self.store.job(job_id)
                if row is None:
                    raise NotFound(f"job {job_id} not found")
                raise Conflict(f"job {job_id} has already finished ({row['state']})")
            now = self.clock()
            if rec.state is State.PENDING:
                self.pending.remove(rec.js)
                self._finish(rec, State.CANCELLED, now, "cancelled", "cancelled while pending")
            elif rec.state is State.RUNNING:
                self._stop(rec, StopReason.CANCEL, now, "cancelled by the user")
            elif rec.stop_reason is not StopReason.CANCEL:  # stopping for another reason
                rec.stop_reason = StopReason.CANCEL
                self.store.update_job(job_id, stop_reason=StopReason.CANCEL.value)
            return rec.state.value

    def reason(self, job_id: int) -> str | None:
        return self.reasons.get(job_id, "queued: waiting for the next scheduling pass")

    def log_path(self, job_id: int) -> Path:
        return self.home / "logs" / f"{job_id}.log"

    def node_usage(self) -> list[dict]:
        with self._lock:
            out = []
            for i, n in enumerate(self.cluster.nodes):
                first, count = self.cluster.node_gpu_range[i]
                free = self.state.gpu_free_milli[first:first + count]
                out.append({
                    "name": n.name, "gpu_model": n.gpu_model, "gpus": n.num_gpus,
                    "gpus_used": float((1000 - free).sum()) / 1000,
                    "gpu_free_milli": [int(x) for x in free],
                    "cpus": n.cpus_milli / 1000,
                    "cpus_used": (n.cpus_milli - int(self.state.node_free_cpu[i])) / 1000,
                    "memory_mib": n.memory_mib,
                    "memory_used_mib": n.memory_mib - int(self.state.node_free_mem[i]),
                    "running": sorted(r.id for r in self.active.values() if r.state.active),
                })
            return out

    def notify(self) -> None:
        """Wake the loop (the runtime calls this, from its own thread, when events are ready)."""
        self._wake.set()

    def _poke(self) -> None:
        self._dirty = True
        self._wake.set()

    # --- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                timeout = self._sleep_for()
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                self.step()
            except Exception:
                log.exception("control loop step failed")

    def _sleep_for(self) -> float:
        now = self.clock()
        t = now + 1.0  # runtime events also poke; this is a safety net
        if self._wake_at is not None:
            t = min(t, self._wake_at)
        t = min(t, min(self._deadlines.values(), default=t))
        return max(0.0, t - now)

    def step(self) -> None:
        """One turn of the loop: runtime events, time limits, then a pass if anything changed."""
        with self._lock:
            now = self.clock()
            for ev in self.runtime.poll():
                self._on_runtime_event(ev, now)
            # Only running jobs with a limit are looked at: a wake-up costs O(running), not
            # O(queue), however many jobs wait.
            for job_id in [j for j, t in self._deadlines.items() if now >= t]:
                rec = self.active[job_id]
                self._stop(rec, StopReason.TIMEOUT, now,
                           f"time limit of {rec.spec.max_runtime:g} s reached")
            self._take_incoming()
            due = self._wake_at is not None and now >= self._wake_at
            if not (self._dirty or due):
                return
            wait = self._next_pass - time.monotonic()
            if wait > 0:  # too soon after the last pass: come back when it is time
                self._wake_at = now + wait if self._wake_at is None else min(self._wake_at,
                                                                               now + wait)
                return
            self._dirty = False
            took = self._pass(now)  # the policy's time; launching processes is not counted
            self._next_pass = time.monotonic() + max(MIN_PASS_INTERVAL_S, 9 * took)

    def _pass(self, now: float) -> float:
        """One scheduling pass, its decisions applied; returns the seconds the policy took."""
        running = {}
        for rec in self.active.values():
            if rec.state is State.RUNNING:
                _account(rec, now)
                running[rec.id] = rec.js
        snap = Snapshot(self.cluster, self.state, list(self.pending), running, self.config)
        t0 = time.monotonic()
        d = self.policy.schedule(snap, now)
        took = time.monotonic() - t0
        self._wake_at = d.wake_at
        for p in d.preempts:
            self._stop(self.active[p.job_id], StopReason.PREEMPT, now, p.reason)
        for s in d.starts:
            rec = self.active[s.job_id]
            if not self.state.fits(s.allocation, rec.js.job.request):
                # GPUs still held by a job that is stopping: the next pass places it.
                self.reasons[rec.id] = "waiting for preempted jobs to release their resources"
                continue
            self._start(rec, s.allocation, now, s.reason)
        for job_id, why in d.waiting.items():
            if job_id in self.active and self.active[job_id].state is State.PENDING:
                self.reasons[job_id] = why
        return took

    def _start(self, rec: Record, alloc: Allocation, now: float, why: str) -> None:
        req = rec.js.job.request
        self.pending.remove(rec.js)
        self.state.allocate(alloc, req)
        rec.attempt += 1
        # The intent is durable before any process exists: a crash in between requeues the job.
        self.store.transition(rec.id, State.PENDING, State.RUNNING, now, "started",
                              f"attempt {rec.attempt}: {why}", start_time=now,
                              attempt=rec.attempt, allocation=allocation_to_json(alloc),
                              handle=None, stop_reason=None, reason=why)
        rec.state, rec.stop_reason = State.RUNNING, None
        js = rec.js
        js.status, js.allocation, js.start_time = JobStatus.RUNNING, alloc, now
        js.first_start = js.first_start if js.first_start is not None else now
        rec.base_attained, rec.base_executed = js.attained, js.executed
        self.reasons.pop(rec.id, None)
        if rec.spec.max_runtime:
            self._deadlines[rec.id] = now + rec.spec.max_runtime
        try:
            rec.handle = self.runtime.launch(self._launch_spec(rec, alloc))
        except PlinthError as e:
            self._release(rec)
            self._finish(rec, State.FAILED, now, "launch-failed", str(e), from_state=State.RUNNING)
            return
        self.store.update_job(rec.id, handle=rec.handle.to_dict())

    def _launch_spec(self, rec: Record, alloc: Allocation) -> LaunchSpec:
        spec, req = rec.spec, rec.js.job.request
        workers = []
        for rank, slot in enumerate(alloc.slots):
            node = self.cluster.nodes[slot.node]
            first = self.cluster.node_gpu_range[slot.node][0]
            workers.append(WorkerLaunch(
                rank=rank, node=node.name, gpus=tuple(g - first for g in slot.gpus),
                gpu_milli=slot.milli, gpu_memory_mib=slot.gpu_memory_mib,
                cpus_milli=req.cpus_milli, memory_mib=req.memory_mib))
        ckpt = spec.checkpoint_dir or str(self.home / "checkpoints" / str(rec.id))
        Path(ckpt).mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(rec.id)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(f"=== plinth: attempt {rec.attempt} of job {rec.id} ({spec.name}) starts "
                    f"at {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")
        # Jobs run in the platform's Python environment first, as a `python` in a spec expects.
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        env = {"PATH": path, "PYTHONUNBUFFERED": "1", **spec.env}
        command = tuple(spec.command)
        if spec.placement is not None:
            # The plan is made for the GPUs this attempt got, before the job's own command runs.
            p, node = spec.placement, self.cluster.nodes[alloc.slots[0].node]
            memory = (p.memory or req.gpu_memory_mib or
                      (node.model.memory_mib if node.model else 16 * 1024)) * 2**20
            env["PLINTH_PLACEMENT"] = json.dumps({"model": p.model, "algo": p.algo,
                                                  "batch": p.batch, "memory_bytes": memory})
            command = (sys.executable, "-m", "plinth.place.for_job", "--", *command)
        return LaunchSpec(job_id=rec.id, attempt=rec.attempt, command=command,
                          workers=tuple(workers), log_path=str(log_path), env=env,
                          workdir=spec.workdir, checkpoint_dir=ckpt)

    def _stop(self, rec: Record, why: StopReason, now: float, message: str) -> None:
        self.store.transition(rec.id, State.RUNNING, State.STOPPING, now, f"stop-{why.value}",
                              message, stop_reason=why.value)
        rec.state, rec.stop_reason = State.STOPPING, why
        self._deadlines.pop(rec.id, None)
        rec.js.status = JobStatus.PENDING  # no longer a running job to the scheduler
        if rec.handle is not None:
            self.runtime.stop(rec.id, rec.attempt, self.grace_s)

    def _on_runtime_event(self, ev: RuntimeEvent, now: float) -> None:
        rec = self.active.get(ev.job_id)
        if rec is None or rec.attempt != ev.attempt or not rec.state.active:
            return  # an earlier attempt's late report
        old = rec.state
        self._release(rec)
        self._poke()
        if ev.kind is EventKind.LOST:
            self._requeue(rec, now, "lost", ev.message or "processes vanished", from_state=old)
            return
        code = ev.exit_code
        if old is State.STOPPING and rec.stop_reason is not None:
            target = after_stop(rec.stop_reason)
            if target is State.PENDING:
                rec.js.preemptions += 1
                rec.js.last_preempted = now
                self._requeue(rec, now, "preempted", f"exit code {code}; requeued",
                              from_state=old, preemptions=rec.js.preemptions)
            else:
                self._finish(rec, target, now, target.value, f"exit code {code}",
                             from_state=old, exit_code=code)
        elif code == 0:
            self._finish(rec, State.SUCCEEDED, now, "succeeded", "exit code 0", from_state=old,
                         exit_code=0)
        elif rec.attempt <= rec.spec.retries:
            self._requeue(rec, now, "retry", f"exit code {code}; retry {rec.attempt} of "
                          f"{rec.spec.retries}", from_state=old, exit_code=code)
        else:
            self._finish(rec, State.FAILED, now, "failed", f"exit code {code}", from_state=old,
                         exit_code=code)

    def _release(self, rec: Record) -> None:
        self._deadlines.pop(rec.id, None)
        js = rec.js
        if js.allocation is not None:
            self.state.release(js.allocation, js.job.request)
            _account(rec, self.clock())
            js.allocation = None

    def _requeue(self, rec: Record, now: float, kind: str, message: str, *,
                 from_state: State | None = None, **fields: object) -> None:
        self.store.transition(rec.id, from_state or rec.state, State.PENDING, now, kind, message,
                              handle=None, allocation=None, stop_reason=None,
                              reason=f"requeued ({kind})", **fields)
        rec.state, rec.handle, rec.stop_reason = State.PENDING, None, None
        rec.js.status, rec.js.pending_since, rec.js.start_time = JobStatus.PENDING, now, None
        self.pending.add(rec.js)
        self.reasons[rec.id] = f"requeued after {kind}: {message}"
        self._poke()

    def _finish(self, rec: Record, state: State, now: float, kind: str, message: str, *,
                from_state: State | None = None, **fields: object) -> None:
        self.store.transition(rec.id, from_state or rec.state, state, now, kind, message,
                              end_time=now, reason=message, **fields)
        rec.state = state
        rec.js.status = JobStatus.COMPLETED
        del self.active[rec.id]
        self.reasons.pop(rec.id, None)
        self._poke()
