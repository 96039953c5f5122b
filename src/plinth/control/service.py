"""The control plane: the store, the API, a clock and a runtime, around the one owner.

All scheduling state lives in `plinth.sched.owner.Owner`, the same object the simulator drives
in virtual time, and the same driver turns it (`plinth.sched.driver.Driver`): it takes events
(submitted, cancelled, exited, lost, checkpoint saved) and the time, calls the policy, applies
its decisions through the lifecycle's transition table, holds jobs back on dependencies and
array throttles, and carries out the instructions (launch, stop, checkpoint-then-stop) through
the runtime. This shell only does the input and output around it, in four parts, each in a
module of its own, behind `ControlPlane`, the one face the API, the CLI and the workload
controllers use:

- the loop (plinth.control.loop): the driver turned from a thread, or by hand on a virtual
  clock; every transition stored before any instruction runs;
- admission (plinth.control.admission): a submission checked, stored and handed to the loop;
- launches (plinth.control.launches): each launch's LaunchSpec, and its handle stored;
- tenants (plinth.control.tenants): the cluster and policy their quotas make, their Unix users
  and folders.

Threads: API handlers call `submit` and `cancel`; the loop's thread handles runtime events,
timers and scheduling passes. They share `_lock`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from plinth.control import tenantfs, users
from plinth.control.admission import Admission
from plinth.control.cancel import cancel_array, cancel_jobs
from plinth.control.errors import Conflict, NotFound
from plinth.control.launches import Launches
from plinth.control.loop import Loop
from plinth.control.metrics import ControlMetrics
from plinth.control.recovery import Recovery, recover
from plinth.control.store import GroupCommit, Store
from plinth.control.tenants import Tenants
from plinth.control.workloads import Workloads
from plinth.core.jobspec import JobSpec
from plinth.core.resources import Cluster, Node
from plinth.core.runtime import Runtime
from plinth.sched import owner as o
from plinth.sched.driver import Driver
from plinth.sched.policies.base import Policy
from plinth.sched.types import SchedConfig

T = TypeVar("T")




class ControlPlane:
    def __init__(self, store: Store, runtime: Runtime, *, home: Path, policy: str = "drf",
                 config: SchedConfig | None = None, grace_s: float = 10.0,
                 clock: Callable[[], float] = time.time, jobs_dir: Path | None = None,
                 kinds: dict[str, dict] | None = None, paced: bool = True) -> None:
        """`jobs_dir`: run each tenant's jobs as its own Unix user, with their checkpoints under
        it (needs root; see plinth.control.users). None: every job runs as this process's
        user, with checkpoints under `home`. `kinds`: per workload kind, the options of its
        controller (`Service`: the autoscaling policy and its tick...). `paced`: passes
        spaced on the wall clock; off on a virtual clock (see plinth.control.loop)."""
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
        self.specs: dict[int, JobSpec] = {}  # active jobs' specs
        self.recovery = Recovery()
        self.writer = GroupCommit(store)
        self.tenants = Tenants(self)
        self.admission = Admission(self)
        self.owner = o.Owner(self.cluster, self.tenants.policy, self.config,
                             keep_finished=False, lookup=self.admission.stored_state)
        self.metrics = ControlMetrics(self)  # /metrics; read at scrape time
        self.launches = Launches(self)
        self.loop = Loop(self, paced=paced)
        kinds = {k: dict(v) for k, v in (kinds or {}).items()}
        kinds.setdefault("Service", {}).setdefault(
            "capacity_cpus", sum(n.cpus_milli for n in self.nodes) / 1000)
        self.workloads = Workloads(self, kinds)
        if "default" in self.tenant_names:
            self.run_as("default")  # its user, named before the admin hands it files

    # --- its parts, as the others see them ----------------------------------------------------

    @property
    def cluster(self) -> Cluster:
        return self.tenants.cluster

    @property
    def tenant_names(self) -> frozenset[str]:
        return self.tenants.names

    @property
    def policy(self) -> Policy:
        return self.owner.policy

    @property
    def driver(self) -> Driver:
        return self.loop.driver

    # --- life ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.recover()
        self.loop.start()

    def close(self) -> None:
        self.loop.stop()
        self.writer.close()
        self.workloads.close()
        self.runtime.close()

    def recover(self) -> None:
        """Rebuild the owner from the store after a (re)start (see plinth.control.recovery),
        then take a first step: what recovery found is stored, and held jobs get their
        reasons (or go), before the API answers."""
        recover(self)
        self.workloads.recover()
        self.step()

    def step(self) -> None:
        self.loop.step()

    def next_step_at(self) -> float | None:
        return self.loop.next_step_at()

    def notify(self) -> None:
        """Wake the loop (the runtime calls this, from its own thread, when events are ready)."""
        self.loop.notify()

    # --- jobs ---------------------------------------------------------------------------------

    def submit(self, spec: JobSpec, tenant: str) -> int:
        return self.admission.submit(spec, tenant)

    def admit(self, spec: JobSpec, tenant: str) -> tuple[JobSpec, dict, float]:
        return self.admission.admit(spec, tenant)

    def accepted(self, job_id: int, spec: JobSpec, now: float) -> int:
        return self.admission.accepted(job_id, spec, now)

    def submit_tasks(self, spec: JobSpec, row: dict, now: float) -> list[int]:
        return self.admission.submit_tasks(spec, row, now)

    def take_incoming(self) -> list[o.Event]:
        return self.admission.take_incoming()

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
        return self.launches.log_path(job_id)

    def node_usage(self, tenant: str | None = None) -> list[dict]:
        """Each node's use; `running` lists only `tenant`'s jobs when a tenant is given (a
        tenant sees how full a node is, not what others run on it)."""
        with self._lock:
            owner, out = self.owner, []
            held = owner.held
            active = [*owner.running.values(), *(owner.jobs[j] for j in owner.stop_why)]
            running = sorted(js.id for js in active if tenant is None or js.job.tenant == tenant)
            for i, n in enumerate(self.cluster.nodes):
                if i in owner.down.nodes:  # it left the cluster
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
                                if any(s.node == i for s in owner.jobs[j].allocation.slots)]
                    if running else [],
                })
            return out

    def read(self, fn: Callable[[o.Owner], T]) -> T:
        """`fn(owner)` under the loop's lock: a consistent view of the queue and the GPUs for
        the dashboard and /metrics, without copying them."""
        with self._lock:
            return fn(self.owner)

    # --- tenants ------------------------------------------------------------------------------

    def set_tenant(self, name: str, gpus: float | None, borrowing_limit: float | None,
                   user: str | None = None) -> str | None:
        """Create a tenant or change its quota; returns the Unix user its jobs run as (None:
        the server's). See plinth.control.users."""
        with self._lock:
            user = self.tenants.set(name, gpus, borrowing_limit, user)
            self.notify()
            return user

    def add_nodes(self, joined: list[Node]) -> None:
        """Nodes that joined the runtime's cluster: the scheduler places on them from the
        next pass (under the loop's lock)."""
        self.nodes = [*self.nodes, *joined]
        policy = self.tenants.rebuild()
        self.owner.add_nodes(self.cluster, policy)

    def run_as(self, tenant: str) -> str | None:
        return self.tenants.run_as(tenant)

    def tenant_root(self, tenant: str, user: users.UnixUser | None) -> Path:
        return self.tenants.root(tenant, user)

    def workload_dir(self, workload_id: int, tenant: str) -> Path:
        return self.tenants.workload_dir(workload_id, tenant)

    def workload_files(self, workload_id: int, tenant: str) -> tenantfs.Handout:
        return self.tenants.workload_files(workload_id, tenant)
