"""The control plane: the store, the API, the wall clock and a runtime, around the one owner.

All scheduling state lives in `plinth.sched.owner.Owner`, the same object the simulator drives
in virtual time: it takes events (submitted, cancelled, exited, lost, checkpoint saved) and the
time, calls the policy, applies its decisions through the lifecycle's transition table, and
returns instructions (launch, stop, checkpoint-then-stop). This shell only does the input and
output around it: it writes every transition to the store before it carries out any instruction
(so a control plane killed at any point restarts with nothing lost: `recover`), launches and
stops processes through the runtime, and feeds the runtime's reports back as events.

Threads: API handlers call `submit` and `cancel`; one loop thread handles runtime events,
timers and scheduling passes. They share `_lock`. The loop wakes on a submit, on a runtime
event and at the owner's next timer (a time limit, a lease ending), and otherwise sleeps.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from plinth.control.kinds import controller_for, reconcile
from plinth.control.spec import JobSpec
from plinth.control.store import Event, GroupCommit, Store
from plinth.core.errors import PlinthError, SpecError, UnplaceableError
from plinth.core.resources import Allocation, Cluster, Request, TenantQuota, WorkerSlot
from plinth.core.workload import Job
from plinth.runtime.base import (
    EventKind,
    Handle,
    LaunchSpec,
    Runtime,
    RuntimeEvent,
    worker_launches,
)
from plinth.sched import owner as o
from plinth.sched.lifecycle import State, StopReason
from plinth.sched.placement import never_fits
from plinth.sched.policies import make_policy
from plinth.sched.policies.base import Policy
from plinth.sched.types import JobState, SchedConfig

log = logging.getLogger("plinth.control")

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


def allocation_to_json(a: Allocation) -> dict:
    return {"slots": [{"node": s.node, "gpus": list(s.gpus), "milli": s.milli,
                       "gpu_memory_mib": s.gpu_memory_mib} for s in a.slots]}


def allocation_from_json(d: dict) -> Allocation:
    return Allocation(tuple(WorkerSlot(int(s["node"]), tuple(int(g) for g in s["gpus"]),
                                       int(s["milli"]), int(s["gpu_memory_mib"]))
                            for s in d["slots"]))


def policy_options(policy: str, quotas: tuple[TenantQuota, ...] | None) -> dict:
    """The options the platform builds its policy with; a replay of its export uses the same."""
    if policy == "drf":  # tenants' quotas, and priority preemption inside a tenant
        return {"quotas": quotas, "preempt_within_tenant": True}
    return {}


def job_from_spec(job_id: int, spec: JobSpec, tenant: str, submit_time: float) -> Job:
    """The scheduler's view of a platform job."""
    return Job(job_id, submit_time, spec.max_runtime or DEFAULT_ESTIMATE_S, spec.request(),
               name=spec.name, tenant=tenant, priority=spec.priority,
               preemptible=spec.preemptible, time_limit=spec.max_runtime,
               retries=spec.retries)


class ControlPlane:
    def __init__(self, store: Store, runtime: Runtime, *, home: Path, policy: str = "drf",
                 config: SchedConfig | None = None, grace_s: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
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
        self.specs: dict[int, JobSpec] = {}  # active jobs' specs
        self.handles: dict[int, Handle] = {}
        self._incoming: deque[tuple[Job, JobSpec]] = deque()  # submitted, not yet seen
        self.writer = GroupCommit(store)
        self._next_pass = 0.0  # monotonic time before which no pass starts
        self._deferred: float | None = None  # a pass put off until then (spacing)
        policy_obj = self._rebuild()
        self.owner = o.Owner(self.cluster, policy_obj, self.config, keep_finished=False)

    # --- set-up -------------------------------------------------------------------------------

    def _rebuild(self) -> Policy:
        """(Re)build the cluster and the policy from the nodes and the tenants' quotas."""
        rows = self.store.tenants()
        quotas = tuple(TenantQuota(r["name"], r["gpus"] or 0.0, r["borrowing_limit"])
                       for r in rows)
        with_quota = any(r["gpus"] is not None for r in rows)
        self.tenant_names = frozenset(r["name"] for r in rows)
        self._never_fits: dict[Request, str | None] = {}  # the nodes are fixed: memoised
        self.cluster = Cluster(tuple(self.nodes), name="local",
                               tenants=quotas if with_quota else ())
        policy = make_policy(self.policy_name,
                             **policy_options(self.policy_name, quotas if with_quota else None))
        missing = sorted(policy.requires - self.runtime.capabilities)
        if missing:
            raise SpecError(f"--policy: {policy.name} needs a runtime that can "
                            f"{' and '.join(missing)}; {type(self.runtime).__name__} cannot")
        return policy

    def set_tenant(self, name: str, gpus: float | None, borrowing_limit: float | None) -> None:
        with self._lock:
            self.store.put_tenant(name, gpus, borrowing_limit)
            policy = self._rebuild()
            self.owner.set_policy(policy, self.cluster)
            self._wake.set()

    @property
    def policy(self) -> Policy:
        return self.owner.policy

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
        """Rebuild the owner from the store after a (re)start: pending jobs queue again; running
        ones are re-adopted if their processes are still the same, else requeued as lost."""
        now = self.clock()
        owner = self.owner
        for row in self.store.active_jobs():
            spec = JobSpec.model_validate(row["spec"])
            job = job_from_spec(row["id"], spec, row["tenant"], row["submit_time"])
            self.specs[job.id] = spec
            js = JobState(job, pending_since=row["submit_time"], attempt=row["attempt"],
                          preemptions=row["preemptions"],
                          checkpoint_step=row.get("checkpoint_step"),
                          checkpoint_time=row.get("checkpoint_time"))
            state = State(row["state"])
            if state is State.PENDING:
                owner.restore(js, now)
                continue
            alloc = allocation_from_json(row["allocation"]) if row["allocation"] else None
            if row["handle"] is None or alloc is None or not owner.held.fits(alloc, job.request):
                # Killed between recording the start and launching, or the nodes changed.
                why = ("control plane restarted before the launch was recorded"
                       if row["handle"] is None else "allocation no longer fits")
                self.store.transition(job.id, state, State.PENDING, now, "lost", why,
                                      handle=None, allocation=None, stop_reason=None,
                                      reason=f"requeued after lost: {why}")
                owner.restore(js, now)
                continue
            js.status, js.allocation = state, alloc
            js.start_time = js.first_start = row["start_time"]
            stop = StopReason(row["stop_reason"]) if row["stop_reason"] else None
            owner.restore(js, now, stop=stop)
            handle = self.handles[job.id] = Handle.from_dict(row["handle"])
            if self.runtime.adopt(handle):
                self.store.add_events([Event(job.id, "adopted", "processes still running "
                                             "(pid and start time match)")], now)
                if state is State.STOPPING:
                    self.runtime.stop(job.id, js.attempt, self.grace_s)
            # else: the runtime queued an EXITED or LOST event; the loop handles it.

    # --- API-facing operations ----------------------------------------------------------------

    def submit(self, spec: JobSpec, tenant: str) -> int:
        """Accept a job: check it, store it, queue it. Returns its id."""
        spec, row, now = self.admit(spec, tenant)
        return self.accepted(self.store.insert_job(row, now), spec, now)

    def admit(self, spec: JobSpec, tenant: str) -> tuple[JobSpec, dict, float]:
        """Check a submission; return the spec as stored, its store row, and the submit time.
        A job that can never fit the cluster is rejected here, with the reason."""
        units, _ = reconcile(controller_for(spec).units(spec, {}, self.clock()), {})
        if len(units) != 1:  # a Job is one unit; kinds with several need a workload record
            raise SpecError(f"kind {spec.kind}: {len(units)} units; the control plane runs "
                            "one-unit workloads only")
        spec = units[0].spec
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
        job = job_from_spec(job_id, spec, spec.tenant or "default", now)
        self._incoming.append((job, spec))
        self._wake.set()
        return job_id

    def _take_incoming(self) -> list[o.Event]:
        events: list[o.Event] = []
        while self._incoming:
            job, spec = self._incoming.popleft()
            self.specs[job.id] = spec
            events.append(o.Submitted(job))
        return events

    def cancel(self, job_id: int) -> str:
        """Cancel a job; returns its state afterwards."""
        with self._lock:
            now = self.clock()
            out = self.owner.handle([*self._take_incoming(), o.Cancelled(job_id)], now,
                                    schedule=False)
            for r in out.rejected:
                if r.event == o.Cancelled(job_id):
                    row = self.store.job(job_id) if r.code == "not-found" else None
                    if r.code == "not-found" and row is None:
                        raise NotFound(f"job {job_id} not found")
                    raise Conflict(f"job {job_id} has already finished "
                                   f"({row['state'] if row else r.message})")
            self._carry_out(out, now)
            js = self.owner.jobs.get(job_id)
            return js.status.value if js is not None else State.CANCELLED.value

    def reason(self, job_id: int) -> str | None:
        js = self.owner.jobs.get(job_id)
        return js.reason if js is not None and js.reason else \
            "queued: waiting for the next scheduling pass"

    def log_path(self, job_id: int) -> Path:
        return self.home / "logs" / f"{job_id}.log"

    def node_usage(self) -> list[dict]:
        with self._lock:
            held, out = self.owner.held, []
            running = sorted(j for j, js in self.owner.jobs.items() if js.status.active)
            for i, n in enumerate(self.cluster.nodes):
                first, count = self.cluster.node_gpu_range[i]
                free = held.gpu_free_milli[first:first + count]
                out.append({
                    "name": n.name, "gpu_model": n.gpu_model, "gpus": n.num_gpus,
                    "gpus_used": float((1000 - free).sum()) / 1000,
                    "gpu_free_milli": [int(x) for x in free],
                    "cpus": n.cpus_milli / 1000,
                    "cpus_used": (n.cpus_milli - int(held.node_free_cpu[i])) / 1000,
                    "memory_mib": n.memory_mib,
                    "memory_used_mib": n.memory_mib - int(held.node_free_mem[i]),
                    "running": [j for j in running
                                if any(s.node == i for s in self.owner.jobs[j].allocation.slots)]
                    if running else [],
                })
            return out

    def notify(self) -> None:
        """Wake the loop (the runtime calls this, from its own thread, when events are ready)."""
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
        t = now + 1.0  # runtime events also wake the loop; this is a safety net
        for timer in (self.owner.next_timer(), self._deferred):
            if timer is not None:
                t = min(t, timer)
        return max(0.0, t - now)

    def step(self) -> None:
        """One turn of the loop: runtime events and submissions in, a pass if one is needed
        and due, the owner's output carried out."""
        with self._lock:
            now = self.clock()
            events = [*self._runtime_events(self.runtime.poll()), *self._take_incoming()]
            owner = self.owner
            out = owner.handle(events, now, schedule=False)
            if owner.pass_needed(now):
                wait = self._next_pass - time.monotonic()
                if wait > 0:  # too soon after the last pass: come back when it is time
                    self._carry_out(out, now)
                    self._deferred = now + wait
                    return
                self._deferred = None
                self._carry_out(out, now)
                out = owner.handle([], now)
                self._next_pass = time.monotonic() + max(MIN_PASS_INTERVAL_S, 9 * out.policy_s)
            self._carry_out(out, now)

    def _runtime_events(self, reports: Iterable[RuntimeEvent]) -> list[o.Event]:
        events: list[o.Event] = []
        for ev in reports:
            if ev.kind is EventKind.EXITED:
                events.append(o.Exited(ev.job_id, ev.attempt, ev.exit_code or 0, ev.message))
            elif ev.kind is EventKind.LOST:
                events.append(o.Lost(ev.job_id, ev.attempt, ev.message or "processes vanished"))
            elif ev.kind is EventKind.CHECKPOINTED:
                events.append(o.CheckpointSaved(ev.job_id, ev.attempt,
                                                ev.at if ev.at is not None else self.clock(),
                                                ev.step))
        return events

    # --- carrying out the owner's output ------------------------------------------------------

    def _carry_out(self, out: o.Output, now: float) -> None:
        """Store every transition, then carry out the instructions; a launch that fails goes
        back to the owner as an event, and so on until nothing is left to do."""
        while True:
            for t in out.transitions:
                self._store(t)
            for js in out.checkpoints:
                self.store.update_job(js.id, checkpoint_step=js.checkpoint_step,
                                      checkpoint_time=js.checkpoint_time)
            for r in out.rejected:
                if not isinstance(r.event, o.Cancelled):
                    log.warning("%s", r.message)
            feedback: list[o.Event] = []
            for ins in out.instructions:
                if type(ins) is o.Launch:
                    feedback.append(self._launch(ins, now))
                else:
                    self.runtime.stop(ins.job_id, ins.attempt, self.grace_s)
            if not feedback:
                return
            out = self.owner.handle(feedback, now, schedule=False)

    def _store(self, t: o.Transition) -> None:
        fields = dict(t.fields)
        if "allocation" in fields:
            a = fields["allocation"]
            fields["allocation"] = allocation_to_json(a) if a is not None else None
            fields["handle"] = None
        if t.new.terminal or t.new is State.PENDING:
            self.handles.pop(t.job_id, None)
        if t.new.terminal:
            self.specs.pop(t.job_id, None)
        if t.old is t.new:
            if fields:
                self.store.update_job(t.job_id, **fields)
            self.store.add_events([Event(t.job_id, t.kind, t.message)], t.at)
        else:
            self.store.transition(t.job_id, t.old, t.new, t.at, t.kind, t.message, **fields)

    def _launch(self, ins: o.Launch, now: float) -> o.Event:
        try:
            handle = self.runtime.launch(self._launch_spec(ins))
        except PlinthError as e:
            return o.LaunchFailed(ins.job_id, ins.attempt, str(e))
        self.handles[ins.job_id] = handle
        self.store.update_job(ins.job_id, handle=handle.to_dict())
        return o.Started(ins.job_id, ins.attempt, now)

    def _launch_spec(self, ins: o.Launch) -> LaunchSpec:
        spec, alloc = self.specs[ins.job_id], ins.allocation
        req = spec.request()
        workers = worker_launches(self.cluster, alloc, req)
        ckpt = spec.checkpoint_dir or str(self.home / "checkpoints" / str(ins.job_id))
        Path(ckpt).mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(ins.job_id)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(f"=== plinth: attempt {ins.attempt} of job {ins.job_id} ({spec.name}) starts "
                    f"at {time.strftime('%Y-%m-%d %H:%M:%S')} on "
                    f"{', '.join(sorted({w.node for w in workers}))} ===\n")
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
        return LaunchSpec(job_id=ins.job_id, attempt=ins.attempt, command=command,
                          workers=tuple(workers), log_path=str(log_path), env=env,
                          workdir=spec.workdir, checkpoint_dir=ckpt)
