"""The Ray runtime: a job's workers run on the nodes of a Ray cluster, where the scheduler put them.

The scheduler decides where; Ray only carries it out. Each attempt gets one placement group
(named and detached, so it outlives this control plane) with one bundle per worker, each bundle
pinned to the node the scheduler chose by Ray's `ray.io/node-id` label. Each worker is a named,
detached actor in that bundle (`plinth-j{job}-a{attempt}-r{rank}`); the actor starts the worker
through the same shim as the local runtime (plinth/runtime/shim.py), in its own session, with the
gang environment of plinth.core.runtime.gang_env: MASTER_ADDR is rank 0's node. Ray reserves the
GPU counts; the GPU indices the worker sees are the scheduler's, not the ones Ray would pick.

One watcher thread serves the runtime. Each worker's actor has a pending `wait` call whose result
is the exit code; the watcher collects finished calls with `ray.wait`, so an exit costs no
polling, and a call that fails because the actor or its node died makes the worker lost. The
watcher also enforces gang semantics, sends the SIGKILL that ends a stop's grace, reports new
checkpoint markers (the checkpoint directory is storage that every node and the control plane
share, as it must be for a job to resume elsewhere), and copies each worker's output from its
node into the job's log file here, with one call per node for all of its workers
(plinth.runtime.ray_logs).

A worker fences itself: it is killed on its node when its actor's raylet dies or the Ray head
has been out of its reach for `fence_after_s` (ray_worker.WorkerActor._fence), so that a worker
on a node cut off and declared dead does not run on beside the attempt that replaced it.

A worker lost with its actor makes its node a suspect: until Ray's health checks declare the
node dead (seconds later), `nodes()` leaves it out if its raylet no longer answers, so that the
control plane, which reads the nodes again when an attempt is lost, takes it out of the
scheduler's view before it places the requeued job.

After a control-plane restart, `adopt` finds each worker's actor by name, checks by job, attempt,
pid and start time that it is the same worker, and waits on it again. A worker that ended while
no one watched is held by its actor with its exit code, until a control plane collects it.

This module is the control plane's side; ray_worker.py is the actor on each node. Ray is
imported only when a RayRuntime is made, so the rest of Plinth does not need it.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from plinth.core.errors import PlinthError, Unavailable
from plinth.core.gpus import GPU_CATALOG
from plinth.core.resources import MILLI, Node
from plinth.core.runtime import EventKind, Handle, LaunchSpec, ProcRef, RuntimeEvent, gang_env
from plinth.runtime.gpu import catalog_model
from plinth.runtime.ray_connect import NAMESPACE, connect_ray, disconnect_ray, one_line
from plinth.runtime.ray_logs import LogShipper, Stream
from plinth.runtime.ray_worker import WorkerActor, actor_name
from plinth.runtime.watch import EventQueue, check_launch, checkpoint_events

log = logging.getLogger(__name__)

POLL_S = 0.05
LOG_EVERY_S = 0.5  # how often a running worker's new output is copied here
CALL_TIMEOUT_S = 30.0  # a call to an actor that takes longer means its node is gone
PG_TIMEOUT_S = 30.0  # how long a placement group may take to be reserved
MIB = 2**20
NODE_ID_LABEL = "ray.io/node-id"
NAME_LABEL = "plinth-node"  # a node's name for the scheduler, if set (else ray-<id prefix>)
RACK_LABEL = "rack"  # a node's rack: this label, or a custom resource "rack:NAME"
RACK_RESOURCE = "rack:"
ACCEL_RESOURCE = "accelerator_type:"  # Ray's GPU model resource, e.g. accelerator_type:A100
# A bundle that would reserve nothing reserves this much CPU: Ray refuses an empty bundle.
MIN_BUNDLE_CPU = 0.01
# A ProcRef's exit_file names the worker's actor: "ray:plinth-j7-a1-r0".
ACTOR_REF = "ray:"
# A node's workers are killed after this long without the Ray head: less than Ray's own window
# for declaring a node dead (health_check_period_ms x health_check_failure_threshold, set on
# the head), after which the job is started again elsewhere.
FENCE_AFTER_S = 10.0
ADOPTED_START_SLACK_S = 1.0  # as the local runtime's: process start times are coarse


@dataclass(frozen=True, slots=True)
class RayNode:
    """A Ray node as the scheduler sees it, and where Ray knows it."""

    node: Node
    node_id: str
    address: str


@dataclass(slots=True)
class _Worker:
    rank: int
    name: str  # of its actor
    actor: object | None  # the actor handle; None: no actor found (adoption)
    pid: int = 0
    start_time: float = 0.0
    wait_ref: object | None = None  # the pending `wait` call: its result is the exit code
    done: bool = False
    code: int | None = None  # once done: None means it vanished without an exit code
    ended_at: float | None = None  # wall clock, from its actor
    why: str = ""  # why it was lost, when it was
    log_path: str = ""  # the job's log file, as its actor knows it (adoption)
    node_id: str = ""  # the Ray node it runs on


@dataclass(slots=True)
class _Attempt:
    job_id: int
    attempt: int
    workers: list[_Worker]
    log_path: str
    checkpoint_dir: str | None = None
    launched_at: float = 0.0  # wall clock; an older marker is not this attempt's
    ended: list[_Worker] = field(default_factory=list)  # in the order they were seen to end
    kill_at: float | None = None  # monotonic time of the SIGKILL that ends a stop's grace
    reason: str = ""
    marker_seen: tuple[int, ...] | None = None
    marker_last: tuple[int, float] | None = None


class RayRuntime(EventQueue):
    """Runs jobs on a Ray cluster; see plinth.core.runtime.Runtime for the contract."""

    capabilities = frozenset({"checkpoint", "relaunch", "elastic", "concurrent-launch"})
    isolation = "ray"

    def __init__(self, address: str, *, notify: Callable[[], None] | None = None,
                 gang_grace_s: float = 10.0, namespace: str = NAMESPACE,
                 fence_after_s: float = FENCE_AFTER_S) -> None:
        """`fence_after_s`: a worker whose node cannot reach the Ray head for that long is
        killed there (see WorkerActor._fence); 0: never."""
        self.ray = connect_ray(address, namespace)
        self.fence_after_s = fence_after_s
        self.namespace = namespace
        self.gang_grace_s = gang_grace_s
        self.problems: list[str] = []
        EventQueue.__init__(self, notify)
        self._suspects: set[str] = set()  # Ray node ids where a worker was lost
        self._actor_cls = self.ray.remote(WorkerActor)
        self._logs = LogShipper(self.ray, namespace, self._problem, every_s=LOG_EVERY_S,
                                call_timeout_s=CALL_TIMEOUT_S)
        self._nodes = self._read_nodes()
        self._attempts: dict[tuple[int, int], _Attempt] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="plinth-ray-runtime",
                                        daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- the protocol

    def nodes(self) -> list[Node]:
        self._nodes = self._read_nodes()
        return [n.node for n in self._nodes.values()]

    def launch(self, spec: LaunchSpec) -> Handle:
        ray = self.ray
        where = f"job {spec.job_id} attempt {spec.attempt}"
        launched_at = time.time()
        self._check(spec)
        key = (spec.job_id, spec.attempt)
        with self._lock:
            if key in self._attempts:
                raise PlinthError(f"{where}: already running")
        try:  # made here, as the local runtime does, even if the job prints nothing
            Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
            Path(spec.log_path).touch()
        except OSError as e:
            raise PlinthError(f"{where}: log_path: cannot create {spec.log_path}: "
                              f"{e.strerror}") from None
        ordered = sorted(spec.workers, key=lambda w: w.rank)
        bundles = [_bundle(w.gpus, w.gpu_milli, w.cpus_milli, w.memory_mib) for w in ordered]
        pg = ray.util.placement_group(
            bundles, strategy="PACK", name=_pg_name(spec.job_id, spec.attempt),
            lifetime="detached",
            bundle_label_selector=[{NODE_ID_LABEL: self._nodes[w.node].node_id}
                                   for w in ordered])
        actors: list = []
        try:
            try:
                ray.get(pg.ready(), timeout=PG_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                # A node that has just joined again, or is leaving: try again later.
                raise Unavailable(
                    f"{where}: Ray could not reserve {bundles} on "
                    f"{[w.node for w in ordered]} within {PG_TIMEOUT_S:g}s; the cluster's free "
                    f"resources differ from the scheduler's view") from None
            strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy
            for i, (w, b) in enumerate(zip(ordered, bundles, strict=True)):
                actors.append(self._actor_cls.options(
                    name=actor_name(spec.job_id, spec.attempt, w.rank),
                    namespace=self.namespace, lifetime="detached", max_restarts=0,
                    max_concurrency=4, num_cpus=b.get("CPU", 0), num_gpus=b.get("GPU", 0),
                    memory=b.get("memory"),
                    scheduling_strategy=strategy(placement_group=pg,
                                                 placement_group_bundle_index=i),
                ).remote(spec.job_id, spec.attempt, w.rank, self.fence_after_s))
            # Every actor is up before any worker starts, so that a gang starts together.
            (master_addr, master_port), *_ = ray.get([a.rendezvous.remote() for a in actors],
                                                     timeout=CALL_TIMEOUT_S)
            envs = gang_env(spec, master_addr=master_addr, master_port=master_port,
                            addresses={w.node: self._nodes[w.node].address for w in ordered})
            started = ray.get([a.start.remote(list(spec.command), {**spec.env, **envs[w.rank]},
                                              spec.workdir, spec.log_path, w.memory_mib,
                                              spec.run_as)
                               for a, w in zip(actors, ordered, strict=True)],
                              timeout=CALL_TIMEOUT_S)
        except Exception as e:
            # All or nothing: a started worker's session is killed before its actor is, since
            # it runs on without it.
            _end_actors(ray, actors)
            ray.util.remove_placement_group(pg)
            if isinstance(e, ray.exceptions.RayTaskError):  # raised on the node: say what
                e = e.cause
            elif isinstance(e, PlinthError):
                raise
            elif isinstance(e, ray.exceptions.RayError):  # an actor or its node died, a timeout
                raise Unavailable(f"{where}: did not start on Ray: {one_line(e)}") from None
            raise PlinthError(f"{where}: did not start on Ray: {one_line(e)}") from None
        workers = [_Worker(w.rank, actor_name(spec.job_id, spec.attempt, w.rank), a, pid, st,
                           node_id=self._nodes[w.node].node_id)
                   for w, a, (pid, st) in zip(ordered, actors, started, strict=True)]
        for wk in workers:
            wk.wait_ref = wk.actor.wait.remote()  # type: ignore[attr-defined]
        with self._lock:
            self._attempts[key] = _Attempt(spec.job_id, spec.attempt, workers, spec.log_path,
                                           spec.checkpoint_dir, launched_at)
        return Handle(spec.job_id, spec.attempt,
                      tuple(ProcRef(w.pid, w.start_time, ACTOR_REF + w.name) for w in workers),
                      spec.checkpoint_dir)

    def stop(self, job_id: int, attempt: int, grace_s: float, *, checkpoint: bool = False
             ) -> None:
        # A real job saves on every SIGTERM it can (plinth.job): `checkpoint` changes nothing.
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is not None:
                self._stop(att, grace_s, f"stopped (SIGTERM, SIGKILL after {grace_s:g}s)")

    def adopt(self, handle: Handle) -> bool:
        key = (handle.job_id, handle.attempt)
        with self._lock:
            if key in self._attempts:
                return True
        workers = [self._adopt_worker(handle, rank, ref) for rank, ref in enumerate(handle.procs)]
        try:  # where they run: rank i is in bundle i
            table = self.ray.util.placement_group_table(
                self.ray.util.get_placement_group(_pg_name(handle.job_id, handle.attempt)))
            for wk in workers:
                wk.node_id = table["bundles_to_node_id"].get(wk.rank, "")
        except ValueError:  # no placement group: its workers are gone too
            pass
        started = min((ref.start_time for ref in handle.procs), default=0.0)
        log_path = next((w.log_path for w in workers if w.log_path), "")
        att = _Attempt(handle.job_id, handle.attempt, workers, log_path, handle.checkpoint_dir,
                       started - ADOPTED_START_SLACK_S)
        att.ended = [w for w in workers if w.done]
        if all(w.done for w in workers):
            end = self._final(att)
            ends = [w.ended_at for w in workers if w.ended_at is not None]
            end = RuntimeEvent(end.job_id, end.attempt, end.kind, end.exit_code, end.message,
                               at=max(ends) if ends else None)
            self._logs.drain(_streams(att, workers))
            self._emit([*self._checkpoints([att], final=True), end])
            self._release(att)
            return False
        with self._lock:
            self._attempts[key] = att
            failed = next((w for w in att.ended if w.code != 0), None)
            if failed is not None:  # gang semantics hold across a restart too
                self._stop(att, self.gang_grace_s, f"rank {failed.rank} {_what(failed)}; "
                                                   "the other workers were stopped")
        return True

    def find(self, job_id: int, attempt: int, workers: int) -> Handle | None:
        """See Runtime.find: the attempt's named actors, if every one started its worker;
        otherwise those there are ended and the placement group is freed."""
        ray, actors, infos = self.ray, [], []
        for rank in range(workers):
            try:
                actor = ray.get_actor(actor_name(job_id, attempt, rank), namespace=self.namespace)
                info = ray.get(actor.info.remote(), timeout=CALL_TIMEOUT_S)
            except (ValueError, ray.exceptions.RayError):
                continue
            actors.append(actor)
            if info["id"][3]:  # its worker was started
                infos.append(info)
        if len(infos) == workers:
            return Handle(job_id, attempt,
                          tuple(ProcRef(i["id"][3], i["id"][4],
                                        ACTOR_REF + actor_name(job_id, attempt, rank))
                                for rank, i in enumerate(infos)),
                          infos[0]["checkpoint_dir"])
        _end_actors(ray, actors)
        _free_pg(ray, job_id, attempt)
        return None

    def close(self) -> None:
        """Stop watching; running workers keep running under their detached actors."""
        self._closed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        disconnect_ray(self.ray)

    # ----------------------------------------------------------------- extras

    def describe(self) -> str:
        lines = []
        for n in self._nodes.values():
            m = n.node
            gpus = f"{m.num_gpus}x{m.gpu_model}" if m.num_gpus else "no GPUs"
            lines.append(f"{m.name} ({n.address}, {m.rack}): {m.cpus_milli / MILLI:g} CPUs, "
                         f"{m.memory_mib} MiB, {gpus}")
        return "\n".join(lines + self.problems)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def running(self) -> list[tuple[int, int]]:
        with self._lock:
            return sorted(self._attempts)

    # ----------------------------------------------------------------- nodes and launching

    def _read_nodes(self) -> dict[str, RayNode]:
        """The live Ray nodes that offer CPUs or GPUs: one that offers neither (a head node
        kept for the cluster's own services, `ray start --head --num-cpus 0 --num-gpus 0`) is
        no place for work, not even for a unit that asks for no CPU."""
        alive = [n for n in self.ray.nodes() if n.get("Alive")]
        with self._lock:
            self._suspects &= {n["NodeID"] for n in alive}  # Ray has declared the rest dead
        nodes = [r for r in (ray_node(n) for n in alive if not self._gone(n))
                 if r.node.cpus_milli or r.node.num_gpus]
        return {n.node.name: n for n in sorted(nodes, key=lambda n: n.node.name)}

    def _gone(self, n: dict) -> bool:
        """Whether node `n`, where a worker was just lost, is gone although Ray still counts it
        alive (its health checks take seconds to fail): its raylet no longer answers. Otherwise
        the job requeued from it could be placed there again."""
        with self._lock:
            if n["NodeID"] not in self._suspects:
                return False
        try:
            socket.create_connection((n["NodeManagerAddress"], n["NodeManagerPort"]),
                                     timeout=1).close()
        except OSError:
            return True
        with self._lock:
            self._suspects.discard(n["NodeID"])  # only its worker died
        return False

    def _check(self, spec: LaunchSpec) -> None:
        if any(w.node not in self._nodes for w in spec.workers):
            self._nodes = self._read_nodes()  # a node may have joined since
        check_launch(spec, closed=self._closed.is_set(), node_is="a live Ray node",
                     gpus_on={name: n.node.num_gpus for name, n in self._nodes.items()})

    # ----------------------------------------------------------------- adoption

    def _adopt_worker(self, handle: Handle, rank: int, ref: ProcRef) -> _Worker:
        name = ref.exit_file.removeprefix(ACTOR_REF)
        wk = _Worker(rank, name, None, ref.pid, ref.start_time)
        try:
            actor = self.ray.get_actor(name, namespace=self.namespace)
            info = self.ray.get(actor.info.remote(), timeout=CALL_TIMEOUT_S)
        except (ValueError, self.ray.exceptions.RayError) as e:
            wk.done, wk.why = True, f"its actor {name} is gone ({one_line(e)})"
            return wk
        if info["id"] != (handle.job_id, handle.attempt, rank, ref.pid, ref.start_time):
            wk.done, wk.why = True, f"actor {name} runs another worker ({info['id']})"
            return wk
        wk.actor, wk.log_path = actor, info["log_path"]
        if info["code"] is not None or info["ended_at"] is not None:  # ended while down
            wk.done, wk.code, wk.ended_at = True, info["code"], info["ended_at"]
            if wk.code is None:
                wk.why = "it vanished while no control plane watched"
        else:
            wk.wait_ref = actor.wait.remote()
        return wk

    # ----------------------------------------------------------------- watching

    def _watch(self) -> None:
        while not self._closed.wait(POLL_S):
            try:
                self._tick()
            except Exception as e:  # the watcher must outlive one bad tick; the error is shown
                log.exception("ray runtime watcher")
                self._problem(f"watcher error: {e!r}")

    def _problem(self, msg: str) -> None:
        if msg not in self.problems[-1:]:
            self.problems[:] = [*self.problems[-19:], msg]

    def _tick(self) -> None:
        ray = self.ray
        with self._lock:
            atts = list(self._attempts.values())
        refs = [w.wait_ref for a in atts for w in a.workers if w.wait_ref is not None]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        now = time.monotonic()
        events, watched, ending = [], [], []
        for att in atts:
            for wk in att.workers:
                if wk.wait_ref is not None and wk.wait_ref in ready:
                    self._collect(wk)
                    with self._lock:
                        att.ended.append(wk)
                        others = any(not o.done for o in att.workers)
                        if wk.code != 0 and others and not att.reason:
                            self._stop(att, self.gang_grace_s, f"rank {wk.rank} {_what(wk)}; "
                                                               "the other workers were stopped")
            with self._lock:
                if att.kill_at is not None and now >= att.kill_at:
                    att.kill_at = None
                    for wk in att.workers:
                        if not wk.done:
                            self._signal(wk, signal.SIGKILL)
                if all(wk.done for wk in att.workers):
                    del self._attempts[(att.job_id, att.attempt)]
                    events.append(self._final(att))
                    ending.append(att)
                else:
                    watched.append(att)
        self._logs.tick([s for att in watched for s in _streams(
            att, [wk for wk in att.workers if not wk.done])], now)
        for att in ending:
            self._logs.drain(_streams(att, att.workers))
            self._release(att)
        self._emit(self._checkpoints(watched) + self._checkpoints(ending, final=True) + events)

    def _collect(self, wk: _Worker) -> None:
        """The result of a finished `wait`: the exit code, or lost if the actor died."""
        ray = self.ray
        try:
            wk.code, wk.ended_at = ray.get(wk.wait_ref)
            if wk.code is None and wk.actor is not None:
                # Vanished: with its actor? A killed actor's worker may die a moment before it
                # does, and the actor still answer `wait`; a dead one fails this call at once.
                try:
                    ray.get(wk.actor.info.remote(), timeout=CALL_TIMEOUT_S)
                except ray.exceptions.GetTimeoutError:
                    pass  # busy, not known dead: the worker alone vanished
        except ray.exceptions.RayError as e:  # the actor, its worker process or its node died
            wk.code, wk.why = None, f"its actor {wk.name} died ({one_line(e)})"
            wk.actor = None
            with self._lock:
                self._suspects.add(wk.node_id)
        if wk.code is None and not wk.why:
            wk.why = "it ended without leaving an exit code"
        wk.done, wk.wait_ref = True, None

    def _stop(self, att: _Attempt, grace_s: float, reason: str) -> None:
        att.reason = att.reason or reason
        sig = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
        for wk in att.workers:
            if not wk.done:
                self._signal(wk, sig)
        deadline = time.monotonic() + grace_s
        if sig == signal.SIGTERM and (att.kill_at is None or deadline < att.kill_at):
            att.kill_at = deadline

    def _signal(self, wk: _Worker, sig: int) -> None:
        """Send `sig` to the worker through its actor, without waiting for the answer: a dead
        actor shows as the worker lost, through its `wait`."""
        if wk.actor is not None:
            wk.actor.signal.remote(int(sig))  # type: ignore[attr-defined]

    def _final(self, att: _Attempt) -> RuntimeEvent:
        lost = [w for w in att.ended if w.code is None]
        if lost:
            return RuntimeEvent(att.job_id, att.attempt, EventKind.LOST, None,
                                f"rank {lost[0].rank}: {lost[0].why}")
        code = next((w.code for w in att.ended if w.code), 0)
        return RuntimeEvent(att.job_id, att.attempt, EventKind.EXITED, code, att.reason)

    def _release(self, att: _Attempt) -> None:
        """End the attempt's actors and free its placement group."""
        ray = self.ray
        _end_actors(ray, [wk.actor for wk in att.workers if wk.actor is not None])
        for wk in att.workers:
            wk.actor = None
        _free_pg(ray, att.job_id, att.attempt)

    def _checkpoints(self, atts: list[_Attempt], *, final: bool = False) -> list[RuntimeEvent]:
        return checkpoint_events(atts, self._problem, final=final)


# --------------------------------------------------------------------- helpers

def ray_node(n: dict) -> RayNode:
    """A Ray node (an entry of ray.nodes()) as the scheduler's Node: its name from the
    plinth-node label, else ray-<id prefix>; its GPUs and model from Ray's GPU and
    accelerator_type resources; its rack from the rack label or a rack:NAME resource."""
    res, labels = n.get("Resources", {}), n.get("Labels") or {}
    name = labels.get(NAME_LABEL) or f"ray-{n['NodeID'][:8]}"
    gpus = int(res.get("GPU", 0))
    accel = next((k[len(ACCEL_RESOURCE):] for k in res if k.startswith(ACCEL_RESOURCE)), None)
    accel = labels.get("ray.io/accelerator-type") or accel
    model = None
    if gpus:  # a catalog name as it is (A100), else the nearest catalog model
        model = accel if accel in GPU_CATALOG else catalog_model(accel or "", 0)[0]
    racks = [k[len(RACK_RESOURCE):] for k in res if k.startswith(RACK_RESOURCE)]
    rack = labels.get(RACK_LABEL) or (racks[0] if racks else "rack-0")
    node = Node(name, int(res.get("CPU", 0) * MILLI), int(res.get("memory", 0) // MIB), model,
                gpus, rack, tuple(sorted(labels.items())))
    return RayNode(node, n["NodeID"], n.get("NodeManagerAddress", ""))


def _bundle(gpus: tuple[int, ...], gpu_milli: int, cpus_milli: int, memory_mib: int
            ) -> dict[str, float]:
    """What Ray reserves for one worker: its GPUs (a fraction for a share), CPUs, memory. A
    worker that asks for no CPU reserves none (as the scheduler counted it: on a node whose
    CPUs are all taken, any CPU would not be there), unless it asks for nothing at all."""
    b: dict[str, float] = {}
    if cpus_milli:
        b["CPU"] = cpus_milli / MILLI
    if gpus:
        b["GPU"] = len(gpus) * gpu_milli / MILLI
    if memory_mib:
        b["memory"] = float(memory_mib * MIB)
    return b or {"CPU": MIN_BUNDLE_CPU}


def _end_actors(ray, actors: list) -> None:
    """Close each actor (its worker killed, its files removed), then end it. A worker runs in a
    session of its own, so it would outlive an actor ended without closing."""
    # A call to an actor that died fails and counts as done; Ray ends what its process left.
    refs = [a.close.remote() for a in actors]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)
    for a in actors:
        try:
            ray.kill(a)
        except ray.exceptions.RayError:
            pass


def _free_pg(ray, job_id: int, attempt: int) -> None:
    """Remove an attempt's placement group, if it has one."""
    try:
        pg = ray.util.get_placement_group(_pg_name(job_id, attempt))
    except ValueError:
        return
    ray.util.remove_placement_group(pg)


def _streams(att: _Attempt, workers: list[_Worker]) -> list[Stream]:
    """The output of `workers` of `att` that is still on their nodes: not of a worker lost
    with its actor (its node may be gone, and a call there would wait its whole timeout)."""
    return [Stream(wk.node_id, wk.name, att.log_path,
                   f"job {att.job_id} attempt {att.attempt} rank {wk.rank}")
            for wk in workers if wk.node_id and att.log_path and wk.actor is not None]


def _pg_name(job_id: int, attempt: int) -> str:
    return f"plinth-j{job_id}-a{attempt}"


def _what(wk: _Worker) -> str:
    return "vanished" if wk.code is None else f"exited with {wk.code}"


def make_ray_runtime(address: str | None, *, fake_gpus: str | None = None,
                     notify: Callable[[], None] | None = None,
                     fence_after_s: float = FENCE_AFTER_S) -> RayRuntime:
    """The runtime `plinth up --runtime ray` runs on, refusing bad options in one line."""
    if not address:
        raise PlinthError("--runtime ray: give the Ray head with --ray-address HOST:PORT "
                          "(or auto)")
    if fake_gpus:
        raise PlinthError("--fake-gpus: the Ray runtime takes its GPUs from the Ray cluster; "
                          "declare fake ones there (ray start --num-gpus)")
    if fence_after_s < 0:
        raise PlinthError(f"--fence-after: {fence_after_s:g} is negative; give seconds, or 0 "
                          "to never fence")
    rt = RayRuntime(address, notify=notify, fence_after_s=fence_after_s)
    if not any(n.num_gpus for n in rt.nodes()):
        rt.close()
        raise PlinthError(f"--ray-address {address}: the Ray cluster has no GPUs (no node "
                          f"offers the GPU resource)")
    return rt
