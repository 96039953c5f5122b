"""The control plane: the store, the API, a clock and a runtime, around the one owner.

All scheduling state lives in `plinth.sched.owner.Owner`, the same object the simulator drives
in virtual time, and the same driver turns it (`plinth.sched.driver.Driver`): it takes events
(submitted, cancelled, exited, lost, checkpoint saved) and the time, calls the policy, applies
its decisions through the lifecycle's transition table, and carries out the instructions
(launch, stop, checkpoint-then-stop) through the runtime. This shell only does the input and
output around it: it writes every transition to the store before any instruction is carried
out (so a control plane killed at any point restarts with nothing lost: `recover`), builds each
launch's LaunchSpec, and takes submissions from the API.

Threads: API handlers call `submit` and `cancel`; one loop thread handles runtime events,
timers and scheduling passes. They share `_lock`. The loop wakes on a submit, on a runtime
event and at the next time the driver names (a time limit, a lease ending), and otherwise
sleeps. Without the loop thread (`start` not called), a caller may turn it by hand on a virtual
clock: `step` whenever `next_step_at` is due (tests/control/virtual.py does, with the simulated
runtime).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from plinth.control import tenantfs, users
from plinth.control.errors import Conflict, NotFound
from plinth.control.cancel import cancel_array, cancel_jobs
from plinth.control.launchspec import launch_spec
from plinth.control.metrics import ControlMetrics
from plinth.control.recovery import Recovery, recover
from plinth.control.store import Event, GroupCommit, Store, Transition
from plinth.control.workloads import Workloads
from plinth.core.errors import PlinthError, SpecError, UnplaceableError
from plinth.core.jobspec import JobSpec, parse_array
from plinth.core.lifecycle import State
from plinth.core.resources import Cluster, Request, TenantQuota
from plinth.core.runtime import EventKind, Handle, Runtime
from plinth.core.workload import Job
from plinth.sched import owner as o
from plinth.sched.driver import Driver, Pacer
from plinth.sched.holds import array_state
from plinth.sched.placement import never_fits
from plinth.sched.policies import make_policy
from plinth.sched.policies.base import Policy
from plinth.sched.quota import platform_quotas
from plinth.sched.types import SchedConfig

log = logging.getLogger("plinth.control")
T = TypeVar("T")

# How often the runtime's nodes are read again, to follow nodes that leave and come back.
NODE_CHECK_S = 2.0
# With nothing else to wake it, the loop still steps this often (a safety net).
IDLE_STEP_S = 1.0


def policy_options(policy: str, quotas: tuple[TenantQuota, ...] | None) -> dict:
    """The options the platform builds its policy with; a replay of its export uses the same."""
    if policy == "drf":  # tenants' quotas, and priority preemption inside a tenant
        return {"quotas": quotas, "preempt_within_tenant": True}
    return {}


class ControlPlane:
    def __init__(self, store: Store, runtime: Runtime, *, home: Path, policy: str = "drf",
                 config: SchedConfig | None = None, grace_s: float = 10.0,
                 clock: Callable[[], float] = time.time, jobs_dir: Path | None = None,
                 kinds: dict[str, dict] | None = None, paced: bool = True) -> None:
        """`jobs_dir`: run each tenant's jobs as its own Unix user, with their checkpoints under
        it (needs root; see plinth.control.users). None: every job runs as this process's
        user, with checkpoints under `home`. `kinds`: per workload kind, the options of its
        controller (`Service`: the router's port, the autoscaling policy...). `paced`: passes
        spaced on the wall clock (plinth.sched.driver.Pacer); off on a virtual clock, where a
        pass takes no time."""
        self.store, self.runtime, self.home = store, runtime, Path(home)
        self.policy_name, self.grace_s, self.clock = policy, grace_s, clock
        self.jobs_dir = jobs_dir
        self.config = config or SchedConfig(min_runtime=30.0)
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        self.nodes = runtime.nodes()
        self._lock = threading.RLock()
        # Where the units of workloads report (plinth.runtime.report); set by the server.
        self.api_url: str | None = None
        self.api_ca: str | None = None  # with TLS: its certificate, for units to verify it by
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.specs: dict[int, JobSpec] = {}  # active jobs' specs
        self.handles: dict[int, Handle] = {}
        self.recovery = Recovery()
        self._incoming: deque[tuple[Job, JobSpec]] = deque()  # submitted, not yet seen
        self.writer = GroupCommit(store)
        self._nodes_due = time.monotonic() + NODE_CHECK_S  # the next look at runtime.nodes()
        self._joined: set[str] = set()  # new nodes, told once
        policy_obj = self._rebuild()
        self.owner = o.Owner(self.cluster, policy_obj, self.config, keep_finished=False,
                             lookup=self._stored_state)
        self.metrics = ControlMetrics(self)  # /metrics; read at scrape time
        self.driver = Driver(self.owner, runtime, clock=clock,
                             launch_spec=lambda ins: launch_spec(self, ins), grace_s=grace_s,
                             record=self._record, launched=self._launched,
                             on_pass=self.metrics.scheduled, pacer=Pacer() if paced else None)
        kinds = {k: dict(v) for k, v in (kinds or {}).items()}
        kinds.setdefault("Service", {}).setdefault(
            "capacity_cpus", sum(n.cpus_milli for n in self.nodes) / 1000)
        self.workloads = Workloads(self, kinds)
        if "default" in self.tenant_names:
            self.run_as("default")  # its user, named before the admin hands it files

    # --- set-up -------------------------------------------------------------------------------

    def _rebuild(self) -> Policy:
        """(Re)build the cluster and the policy from the nodes and the tenants' quotas."""
        rows = self.store.tenants()
        quotas = platform_quotas(rows, sum(n.num_gpus for n in self.nodes))
        self.tenant_names = frozenset(r["name"] for r in rows)
        self.tenant_users: dict[str, str | None] = {r["name"]: r["unix_user"] for r in rows}
        self._never_fits: dict[Request, str | None] = {}  # the nodes are fixed: memoised
        self.cluster = Cluster(tuple(self.nodes), name="local",
                               tenants=quotas)
        policy = make_policy(self.policy_name,
                             **policy_options(self.policy_name, quotas or None))
        missing = sorted(policy.requires - self.runtime.capabilities)
        if missing:
            raise SpecError(f"--policy: {policy.name} needs a runtime that can "
                            f"{' and '.join(missing)}; {type(self.runtime).__name__} cannot")
        return policy

    def set_tenant(self, name: str, gpus: float | None, borrowing_limit: float | None,
                   user: str | None = None) -> str | None:
        """Create a tenant or change its quota; returns the Unix user its jobs run as (None:
        the server's). See plinth.control.users."""
        with self._lock:
            user = self._tenant_user(name, user)
            self.store.put_tenant(name, gpus, borrowing_limit, user)
            policy = self._rebuild()
            self.owner.set_policy(policy, self.cluster)
            self._wake.set()
            return user

    def _tenant_user(self, tenant: str, asked: str | None) -> str | None:
        if self.jobs_dir is None:  # not root: every job runs as the server's user
            if asked is not None:
                raise SpecError(f"user: tenants run as their own Unix users only when the "
                                f"control plane runs as root (it runs as uid {os.geteuid()})")
            return None
        if asked is not None:
            return users.existing_user(asked, "user").name
        return self.tenant_users.get(tenant) or users.ensure_user(tenant).name

    def run_as(self, tenant: str) -> str | None:
        """The Unix user `tenant`'s jobs run as: None (the server's own) when the control plane
        is not root; as root, the user the admin mapped it to, else one of its own
        (plinth-TENANT), `default` included: root is never a tenant's user."""
        if self.jobs_dir is None:
            return None
        user = self.tenant_users.get(tenant)
        if user is None:  # a tenant stored before it had a user: `default`, made at bootstrap
            user = self.tenant_users[tenant] = users.ensure_user(tenant).name
            row = next((r for r in self.store.tenants() if r["name"] == tenant), None)
            if row is not None:  # `plinth tenant ls` says so
                self.store.put_tenant(tenant, row["gpus"], row["borrowing_limit"], user)
        return user

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
        self.workloads.close()
        self.driver.close()
        self.runtime.close()

    def recover(self) -> None:
        """Rebuild the owner from the store after a (re)start (see plinth.control.recovery),
        then take a first step: what recovery found is stored, and held jobs get their
        reasons (or go), before the API answers."""
        recover(self)
        self.workloads.recover()
        self.step()

    # --- API-facing operations ----------------------------------------------------------------

    def submit(self, spec: JobSpec, tenant: str) -> int:
        """Accept a job: check it, store it, queue it. Returns its id."""
        spec, row, now = self.admit(spec, tenant)
        if spec.array:
            return self.submit_tasks(spec, row, now)[0]
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
        if spec.array_index is not None or spec.array_id is not None:
            raise SpecError("array_index: set by the platform for the tasks of an array; "
                            "ask for one with `array: 0-99`")
        spec = spec.model_copy(update={"tenant": tenant})
        row = {"name": spec.name, "tenant": tenant, "priority": spec.priority,
               "spec": spec.model_dump(mode="json"), "reason": "queued"}
        return spec, row, self.clock()

    def accepted(self, job_id: int, spec: JobSpec, now: float) -> int:
        """Queue a job the store now holds. It is handed to the loop without taking `_lock`, so
        a submission never waits for a scheduling pass."""
        job = spec.job(job_id, spec.tenant or "default", now)
        self._incoming.append((job, spec))
        self.metrics.submitted(job.tenant, spec.kind)
        self._wake.set()
        return job_id

    def take_incoming(self) -> list[o.Event]:
        """New submissions, as the owner's events (it holds back those that wait on others or
        for their array's turn: plinth.sched.holds)."""
        events: list[o.Event] = []
        while self._incoming:
            job, spec = self._incoming.popleft()
            self.specs[job.id] = spec
            events.append(o.Submitted(job))
        return events

    def _stored_state(self, job_id: int) -> tuple[State, bool] | None:
        """(state, has started) of a job the owner no longer holds (it ended, or was just
        submitted and not yet taken in), for the jobs that wait on it; None if there is no
        such job. An array's id stands for all its tasks, as in Slurm."""
        row = self.store.job(job_id)
        if row is None or row["array_id"] != job_id:
            return None if row is None else (State(row["state"]), row["attempt"] > 0)
        states, started = self.store.array_summary(job_id)
        failed = any(s.terminal and s is not State.SUCCEEDED for s in states)
        return array_state(all(s.terminal for s in states), failed, started)

    def submit_tasks(self, spec: JobSpec, row: dict, now: float) -> list[int]:
        """Store and queue the tasks of a job array (`spec.array`), one job each with its
        index; the array's id is its first task's."""
        indices, _ = parse_array(spec.array)  # type: ignore[arg-type]  # an array spec
        tasks = [spec.model_copy(update={"array_index": i}) for i in indices]
        ids = self.store.insert_jobs([({**row, "spec": t.model_dump(mode="json"),
                                        "array_index": t.array_index}, now, "") for t in tasks],
                                     array=True)
        for job_id, t in zip(ids, tasks):
            self.accepted(job_id, t.model_copy(update={"array_id": ids[0]}), now)
        return ids

    def cancel(self, job_id: int) -> str:
        """Cancel a job; returns its state afterwards."""
        states, refused = cancel_jobs(self, [job_id])
        r = refused.get(job_id)
        if r is not None:
            row = self.store.job(job_id) if r.code == "not-found" else None
            if r.code == "not-found" and row is None:
                raise NotFound(f"job {job_id} not found")
            raise Conflict(f"job {job_id} has already finished "
                           f"({row['state'] if row else r.message})")
        return states[job_id]

    def cancel_array(self, array_id: int) -> dict[int, str]:
        """Cancel every unfinished task of an array, as `scancel ARRAY` does, all in one turn
        (plinth.control.cancel); returns each one's state afterwards."""
        return cancel_array(self, array_id)

    def reason(self, job_id: int) -> str | None:
        held = self.owner.holds.reason(job_id)
        if held is not None:
            return held
        js = self.owner.jobs.get(job_id)
        why = js.reason if js is not None and js.reason else \
            "queued: waiting for the next scheduling pass"
        down = self.owner.down.nodes
        if down and js is not None and js.job.request.nodes:
            gone = [n for n in js.job.request.nodes if self.cluster.node_index.get(n) in down]
            if gone:
                why += f"; {', '.join(gone)} (in its nodelist) left the cluster"
        return why

    def log_path(self, job_id: int) -> Path:
        return self.home / "logs" / f"{job_id}.log"

    def node_usage(self, tenant: str | None = None) -> list[dict]:
        """Each node's use; `running` lists only `tenant`'s jobs when a tenant is given (a
        tenant sees how full a node is, not what others run on it)."""
        with self._lock:
            held, out = self.owner.held, []
            running = sorted(j for j, js in self.owner.jobs.items() if js.status.active
                             and (tenant is None or js.job.tenant == tenant))
            for i, n in enumerate(self.cluster.nodes):
                if i in self.owner.down.nodes:  # it left the cluster
                    continue
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

    def read(self, fn: Callable[[o.Owner], T]) -> T:
        """`fn(owner)` under the loop's lock: a consistent view of the queue and the GPUs for
        the dashboard and /metrics, without copying them."""
        with self._lock:
            return fn(self.owner)

    def notify(self) -> None:
        """Wake the loop (the runtime calls this, from its own thread, when events are ready)."""
        self._wake.set()

    # --- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                due = self.next_step_at()
                timeout = max(0.0, due - self.clock()) if due is not None else IDLE_STEP_S
            self._wake.wait(min(timeout, IDLE_STEP_S))  # runtime events wake it too
            if self._stopping.is_set():
                break
            try:
                self.step()
            except Exception:
                log.exception("control loop step failed")

    def next_step_at(self) -> float | None:
        """When `step` is next due: now if something waits (a submission, a runtime report,
        held jobs to look at again), else the driver's next time (a timer, a pass put off, a
        virtual runtime's next event); None: not until something comes."""
        if self._wake.is_set():
            return self.clock()
        return self.driver.next_time()

    def step(self) -> None:
        """One turn of the loop: runtime events and submissions in, a pass if one is needed
        and due, the owner's output carried out (see plinth.sched.driver)."""
        with self._lock:
            self._wake.clear()  # what comes from here on wakes the next step
            now = self.clock()
            reports = self.runtime.poll()
            # A lost attempt may be the first sign of a node that left: look at once, so that
            # the requeued job is not placed there again. (A runtime whose nodes are fixed,
            # the local one, is not asked.)
            if "elastic" in self.runtime.capabilities and (
                    time.monotonic() >= self._nodes_due
                    or any(r.kind is EventKind.LOST for r in reports)):
                self._follow_nodes()
            self.driver.turn([*self.driver.events(reports, now), *self.take_incoming()], now)
            self.workloads.tick(now)

    def _follow_nodes(self) -> None:
        """Take the nodes that have left the runtime out of the scheduler's view, and put back
        those that have returned (see plinth.sched.nodes); their jobs end as the runtime reports
        them lost. A node the cluster did not have at start is used after a restart."""
        self._nodes_due = time.monotonic() + NODE_CHECK_S
        try:
            live = {n.name for n in self.runtime.nodes()}
        except Exception as e:  # noqa: BLE001 -- its cluster did not answer: look again later
            log.warning("the runtime's nodes could not be read: %s", e)
            return
        names = [n.name for n in self.cluster.nodes]
        down = frozenset(i for i, name in enumerate(names) if name not in live)
        was = self.owner.down.nodes
        for i in sorted(down - was):
            log.warning("node %s left the cluster: its jobs are lost and requeued, and nothing "
                        "is placed on it until it is back", names[i])
        for i in sorted(was - down):
            log.warning("node %s is back in the cluster", names[i])
        for name in sorted(live - set(names) - self._joined):
            self._joined.add(name)
            log.warning("node %s joined the cluster: it is used after the control plane "
                        "restarts", name)
        self.owner.set_down(down)

    # --- recording the owner's output ---------------------------------------------------------

    def _record(self, out: o.Output) -> None:
        """Store every transition of `out` (before the driver carries out its instructions),
        and the checkpoints it saw."""
        moves: list[Transition] = []  # written together: one transaction, not one each
        for t in out.transitions:
            self._store(t, moves)
        self.store.transitions(moves)
        for js in out.checkpoints:
            self.store.update_job(js.id, checkpoint_step=js.checkpoint_step,
                                  checkpoint_time=js.checkpoint_time)
        for r in out.rejected:
            if not isinstance(r.event, o.Cancelled):
                log.warning("%s", r.message)
        if out.held_examined:
            self.metrics.held_examined(out.held_examined)

    def _store(self, t: o.Transition, moves: list[Transition]) -> None:
        """Record `t`: a move between states joins `moves` (the caller writes them); a change
        within a state is written now, after the moves before it."""
        fields = dict(t.fields)
        if "allocation" in fields:
            a = fields["allocation"]
            fields["allocation"] = a.to_dict() if a is not None else None
            fields["handle"] = None
        if t.new.terminal or t.new is State.PENDING:
            self.handles.pop(t.job_id, None)
        at = t.at
        if t.new.terminal:
            self.specs.pop(t.job_id, None)
            self.workloads.job_ended(t.job_id, t.new)
            ended = self.driver.ended_at.pop(t.job_id, None)
            if ended is not None and "end_time" in fields:
                at = fields["end_time"] = min(ended, t.at)
        if t.new is State.STOPPING and "reason" not in fields:
            fields["reason"] = f"stopping: {t.message}"
        if t.old is t.new:
            self.store.transitions(moves)
            moves.clear()
            if fields:
                self.store.update_job(t.job_id, **fields)
            self.store.add_events([Event(t.job_id, t.kind, t.message)], t.at)
        else:
            moves.append(Transition(t.job_id, t.old, t.new, at, t.kind, t.message, fields))

    def _launched(self, ins: o.Launch, handle: Handle) -> None:
        """A launch worked: its handle is stored, for `recover` to adopt it after a restart."""
        self.handles[ins.job_id] = handle
        self.store.update_job(ins.job_id, handle=handle.to_dict())

    def tenant_root(self, tenant: str, user: users.UnixUser | None) -> Path:
        """Where a tenant's jobs keep their state: under $PLINTH_HOME, or as root in the
        tenant's own folder of --jobs-dir."""
        return (self.home / "checkpoints" if self.jobs_dir is None else
                users.tenant_dir(self.jobs_dir, tenant, user))

    def workload_dir(self, workload_id: int, tenant: str) -> Path:
        """A workload's folder in its tenant's own: its units' state (checkpoints, results,
        status), made by the units themselves, as the tenant; the control plane makes nothing
        in it and reads nothing from it."""
        run_as = self.run_as(tenant)
        user = users.UnixUser.named(run_as) if run_as else None
        return self.tenant_root(tenant, user) / f"workload-{workload_id}"

    def workload_files(self, workload_id: int, tenant: str) -> tenantfs.Handout:
        """The folder of the files a workload's controller hands its units (an FL task's app
        and tokens): the control plane's own, which the tenant's jobs can read and cannot
        write or swap (see plinth.control.tenantfs); made if missing."""
        run_as = self.run_as(tenant)
        gid = users.UnixUser.named(run_as).gid if run_as else os.getegid()
        return tenantfs.handout(self.jobs_dir, self.home, tenant, gid, f"workload-{workload_id}")
