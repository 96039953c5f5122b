"""A control plane's launches: how the owner's Launch becomes the runtime's LaunchSpec (where a
job's attempt runs, as whom, with which environment, log and checkpoint folder), and the handle
of each launch that worked, stored for a restarted control plane to adopt. The driver
(plinth.sched.driver) carries the launches out, a batch at a time.

Part of `plinth.control.service.ControlPlane`, which answers for it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from plinth.control import users
from plinth.core.runtime import Handle, LaunchSpec, worker_launches
from plinth.runtime import report
from plinth.sched import owner as o

if TYPE_CHECKING:
    from plinth.control.service import ControlPlane


class Launches:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.handles: dict[int, Handle] = {}  # the launched attempts of active jobs

    def log_path(self, job_id: int) -> Path:
        return self.cp.home / "logs" / f"{job_id}.log"

    def spec(self, ins: o.Launch) -> LaunchSpec:
        """What the runtime needs to start `ins`: the workers, the tenant's user, the job's log
        (opened, the tenant's), its checkpoint folder, its environment and its command."""
        cp, log_path = self.cp, self.log_path(ins.job_id)
        spec, alloc = cp.specs[ins.job_id], ins.allocation
        req = spec.request()
        workers = worker_launches(cp.cluster, alloc, req)
        tenant = spec.tenant or "default"
        run_as = cp.run_as(tenant)
        user = users.UnixUser.named(run_as) if run_as else None
        # Made by the job when it first saves (plinth.job), so a job that never saves leaves
        # no empty folder behind; with per-tenant users, under its tenant's own folder. A unit
        # of a workload keeps one folder across the jobs that replace it (its state: an FL
        # server's round checkpoints), as a StatefulSet's pod keeps its volume.
        root = cp.tenant_root(tenant, user)
        unit = cp.workloads.job_unit.get(ins.job_id)
        ckpt = spec.checkpoint_dir or str(
            cp.workload_dir(unit[0], tenant) / unit[1] if unit else root / str(ins.job_id))
        with open(log_path, "a", encoding="utf-8") as f:
            if user is not None:  # the tenant's; in a folder only the server can enter
                os.fchown(f.fileno(), user.uid, user.gid)
                os.fchmod(f.fileno(), 0o600)
            f.write(f"=== plinth: attempt {ins.attempt} of job {ins.job_id} ({spec.name}) starts "
                    f"at {time.strftime('%Y-%m-%d %H:%M:%S')} on "
                    f"{', '.join(sorted({w.node for w in workers}))} ===\n")
        # Jobs run in the platform's Python environment first, as a `python` in a spec expects.
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        # A tenant's own user has its own folder as HOME, not the server's.
        home = {} if cp.jobs_dir is None else {"HOME": str(root)}
        env = {"PATH": path, "PYTHONUNBUFFERED": "1", **home, **spec.env}
        token = cp.workloads.unit_token(ins.job_id, ins.attempt)
        if token is not None and cp.api_url:  # a unit: it reports over the API (runtime.report)
            env.update({report.URL_ENV: f"{cp.api_url}/v1/units/report", report.TOKEN_ENV: token,
                        **({report.CA_ENV: cp.api_ca} if cp.api_ca else {})})
        if spec.array_index is not None:  # as SLURM_ARRAY_TASK_ID and SLURM_ARRAY_JOB_ID
            env.update(PLINTH_ARRAY_INDEX=str(spec.array_index),
                       PLINTH_ARRAY_JOB_ID=str(spec.array_id))
        command = tuple(spec.command)
        if spec.placement is not None:
            # The plan is made for the GPUs this attempt got, before the job's own command runs,
            # and written into the checkpoint folder by that step (plinth.place.for_job), which
            # runs as the job's user and makes the folder: nothing is made here, as root, in a
            # folder the tenant can write.
            p, node = spec.placement, cp.cluster.nodes[alloc.slots[0].node]
            memory = (p.memory or req.gpu_memory_mib or
                      (node.model.memory_mib if node.model else 16 * 1024)) * 2**20
            env["PLINTH_PLACEMENT"] = json.dumps({"model": p.model, "algo": p.algo,
                                                  "batch": p.batch, "memory_bytes": memory})
            command = (sys.executable, "-m", "plinth.place.for_job", "--", *command)
        return LaunchSpec(job_id=ins.job_id, attempt=ins.attempt, command=command,
                          workers=tuple(workers), log_path=str(log_path), env=env,
                          workdir=spec.workdir, checkpoint_dir=ckpt, run_as=run_as)

    def launched(self, ins: o.Launch, handle: Handle) -> None:
        """A launch worked: its handle is stored, for a restart to adopt it."""
        self.handles[ins.job_id] = handle
        self.cp.store.update_job(ins.job_id, handle=handle.to_dict())
