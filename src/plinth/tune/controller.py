"""The Tune controller: a tuning task as runtime units (an RPC tracker, servers, clients).

    units(workload, observed, now) -> [tracker, server-<share>-<j>..., client-<share>-<i>...]

For each share s the task runs `servers` tuning servers that measure candidates, registered
with the task's own RPC tracker under the key `share-s`, and `clients` tuning clients that
search and build, each over its shard of the model's tasks (`plan.shard`), measuring through
MetaSchedule's RPC runner on the servers of its share. A server asks for its share: on a GPU a
fraction with an MPS thread percentage, on a CPU `share` cores (the runtime's CPU limits pin
it; the server runs `share` threads). A client that succeeds is done (one that fails runs
again, `CLIENT_TRIES` in all); a server that dies is replaced. The servers of a share are
dropped once all its clients are done, and the tracker once every client is.

Units may run on any host. The tracker and each server bind their own node's address and
report the address they bound (`plinth.tune.reports`); the controller keeps it in the task's
status (`addresses`, with the job attempt that bound it: an address is current only while that
attempt runs) and passes the tracker's to the servers and clients on their command lines, so
no address is chosen here. The servers start once the tracker has reported; a share's clients
once one of its servers has (started earlier, a client would spend its trials timing out at
the tracker, waiting for a server that is still queued). A tracker that ends or restarts takes
its address with it: its servers, which could never reach the new one, are dropped, and start
again once it reports. Each client reports what it tuned when it is done (`results`); its
records go to the task's database, `db`, which on several hosts is a folder every host mounts.

Shares that do not fit the cluster together run one after another, as the scheduler places
their servers. So that this cannot deadlock, the tracker reserves no CPU (it only routes
requests: with 0.1 CPU held, a share of the whole machine could never be placed while the
tracker lives, and the tracker lives until that share's clients are done).

Pure: the same workload and observed units give the same units.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from pydantic import BaseModel

from plinth.core.errors import SpecError
from plinth.core.jobspec import JobSpec, Resources
from plinth.core.kinds import BaseController, Context, Observed, Unit, Workload, WorkloadState
from plinth.core.lifecycle import State
from plinth.core.spec import TRUSTED
from plinth.tune.plan import share_key
from plinth.tune.reports import Bound, Tuned
from plinth.tune.spec import TuneSpec

# The interpreter that has Plinth installed: the units run Plinth's own entry points.
PYTHON = sys.executable
CLIENT_TRIES = 2  # a client that fails is started again once; its finished records stay
TRACKER_MIB = 1024  # TVM imported: 256 MiB of RLIMIT_DATA leaves no room for a thread


def unit_names(spec: TuneSpec) -> dict[float, tuple[list[str], list[str]]]:
    """(server names, client names) of each share."""
    return {s: ([f"server-{share_key(s)}-{j}" for j in range(spec.servers)],
                [f"client-{share_key(s)}-{i}" for i in range(spec.clients)])
            for s in spec.shares}


class TuneController(BaseController):
    """Units of Tune workloads (`plinth.core.kinds.Controller`); its record in `w.status`:
    each client's ended jobs (`ended`), the addresses the tracker and servers reported
    (`addresses`) and what each client tuned (`results`)."""

    kind = "Tune"

    def check(self, w: Workload, ctx: Context) -> None:
        spec = _spec(w)
        cluster_cpus, cluster_gpus = ctx.capacity().cpus, ctx.capacity().gpus
        if spec.target == "cpu" and max(spec.shares) > cluster_cpus:
            raise SpecError(f"shares: {max(spec.shares):g} cores is more than the cluster's "
                            f"{cluster_cpus:g} CPUs")
        if spec.target == "cuda" and cluster_gpus == 0:
            raise SpecError("target: cuda, but the cluster has no GPU")

    def start(self, w: Workload, ctx: Context) -> None:
        """What `plinth ls` shows of the task (the list of workloads carries no specs)."""
        spec = _spec(w)
        w.status.update(target=spec.target, shares=list(spec.shares), trials=spec.trials,
                        clients_per_share=spec.clients, db=spec.db)

    def unit_ended(self, w: Workload, unit: str, ctx: Context) -> None:
        """Called once per ended job of a unit; counts the clients' failures."""
        w.status.setdefault("ended", {})
        w.status["ended"][unit] = w.status["ended"].get(unit, 0) + 1

    def units(self, w: Workload, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        spec = _spec(w)
        tracker = _address(w, observed, "tracker")  # None until the running tracker reports
        # A client that runs keeps the tracker it was started with (should that one be gone,
        # the client fails its measurements until it ends); a new one gets the running one.
        last = w.status.get("addresses", {}).get("tracker", {}).get("address")
        out: list[Unit] = []
        for share, (servers, clients) in unit_names(spec).items():
            left = [c for c in clients if not _done(w, observed, c)]
            if not left:
                continue
            if tracker is not None:  # a server that died is replaced: it lost only its
                out += [Unit(n, server_job(spec, share, n, tracker)) for n in servers]  # trials
            serving = tracker is not None and any(_address(w, observed, n) for n in servers)
            out += [Unit(n, client_job(spec, share, clients.index(n), n, tracker or last))
                    for n in left if serving or (_live(observed, n) and last)]
        left_any = any(not _done(w, observed, c) for _, cs in unit_names(spec).values()
                       for c in cs)
        return [Unit("tracker", tracker_job(spec))] + out if left_any else []

    def report_model(self, w: Workload, unit: str) -> type[BaseModel] | None:
        names = unit_names(_spec(w)).values()
        if unit == "tracker" or any(unit in servers for servers, _ in names):
            return Bound
        return Tuned if any(unit in clients for _, clients in names) else None

    def report(self, w: Workload, unit: str, body: BaseModel, ctx: Context) -> bool:
        """The address a tracker or server bound (and which job attempt bound it), or what a
        client tuned."""
        if isinstance(body, Bound):
            at = body.model_dump()
            if w.status.get("addresses", {}).get(unit) == at:
                return False
            w.status.setdefault("addresses", {})[unit] = at
            return True
        if isinstance(body, Tuned):
            w.status.setdefault("results", {})[unit] = body.model_dump(exclude_none=True)
            return True
        return False

    def finished(self, w: Workload, observed: Mapping[str, Observed]) -> WorkloadState | None:
        """succeeded when every client has, failed when one has given up, else None."""
        clients = [c for _, cs in unit_names(_spec(w)).values() for c in cs]
        if not all(_done(w, observed, c) for c in clients):
            return None
        ok = all(observed[c].state is State.SUCCEEDED for c in clients)
        return WorkloadState.SUCCEEDED if ok else WorkloadState.FAILED


def _spec(w: Workload) -> TuneSpec:
    if not isinstance(w.spec, TuneSpec):
        raise SpecError(f"kind Tune: expected a Tune spec, got {type(w.spec).__name__}")
    return w.spec


def _done(w: Workload, observed: Mapping[str, Observed], client: str) -> bool:
    """A client is done once it has succeeded, or failed CLIENT_TRIES times."""
    o = observed.get(client)
    if o is None or not o.state.terminal:
        return False
    tries = int(w.status.get("ended", {}).get(client, 1))
    return o.state is State.SUCCEEDED or tries >= CLIENT_TRIES


def _live(observed: Mapping[str, Observed], unit: str) -> bool:
    """It has a job that has not ended (a client keeps it while its server is replaced)."""
    return unit in observed and not observed[unit].state.terminal


def _address(w: Workload, observed: Mapping[str, Observed], unit: str) -> str | None:
    """The address `unit` listens on, if the attempt of its job that runs now has reported it
    (what an attempt that has ended reported is gone with it)."""
    at = w.status.get("addresses", {}).get(unit)
    o = observed.get(unit)
    if at is None or o is None or o.state is not State.RUNNING or \
            (o.job_id, o.attempt) != (at["job"], at["attempt"]):
        return None
    return str(at["address"])


def _job(spec: TuneSpec, unit: str, command: list[str], resources: Resources) -> JobSpec:
    return JobSpec(name=f"{spec.name}-{unit}"[:63], tenant=spec.tenant, command=command,
                   resources=resources, priority=spec.priority,
                   preemptible=False)  # a preempted server or client loses its trials


def no_cpu(memory_mib: int) -> Resources:
    """Resources that reserve no CPU: a tenant's spec may not ask for that, the platform's
    own units may (TRUSTED)."""
    return Resources.model_validate({"cpus": 0, "memory": memory_mib}, context=TRUSTED)


def tracker_job(spec: TuneSpec) -> JobSpec:
    return _job(spec, "tracker", [PYTHON, "-m", "plinth.tune.tracker"],
                no_cpu(TRACKER_MIB))  # no CPU: see the module's docstring


def server_job(spec: TuneSpec, share: float, name: str, tracker: str) -> JobSpec:
    cmd = [PYTHON, "-m", "plinth.tune.server", "--tracker", tracker, "--key", share_key(share)]
    if spec.target == "cpu":
        res = Resources(cpus=share, memory=spec.memory)
        cmd += ["--threads", str(int(share))]
    else:  # an MPS share of one GPU; its GPU memory is split in proportion
        res = Resources(cpus=1, memory=spec.memory, gpu_fraction=share / 100)
    return _job(spec, name, cmd, res)


def client_job(spec: TuneSpec, share: float, index: int, name: str, tracker: str) -> JobSpec:
    cmd = [PYTHON, "-m", "plinth.tune.client",
           "--model", spec.model, "--input-shape", ",".join(map(str, spec.input_shape)),
           "--target", spec.target, "--share", f"{share:g}",
           "--shard", f"{index}/{spec.clients}", "--servers", str(spec.servers),
           "--trials", str(spec.trials), "--trials-per-iter", str(spec.trials_per_iter),
           "--seed", str(spec.seed), "--builder", spec.builder, "--db", spec.db,
           "--tracker", tracker]
    # A client reserves no CPU of its own: its search and builds run between its server's
    # measurements, so a share can be a whole small machine (2 of 2 cores) and still be tuned.
    return _job(spec, name, cmd, no_cpu(spec.memory))
