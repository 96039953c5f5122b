"""The local runtime: a job's workers are processes on this machine.

Each worker is started as a shim (plinth/runtime/shim.py) in its own session, so that it and
everything it starts form one process group that can be signalled as a whole. The shim runs the
command, relays SIGTERM to its group, and leaves the exit code in a file, so that a control plane
restarted after a crash can still learn how a worker it did not start ended.

One watcher thread serves the whole runtime. Every 50 ms it reaps the runtime's own children
(os.waitid) and checks adopted workers (psutil, pid plus start time), turns finished attempts
into events, enforces gang semantics (one worker fails, the others are stopped) and sends SIGKILL
when a stop's grace period runs out, so that no caller ever sleeps.

Checkpoints reach the platform through a file, so that a job never needs a token: after a
checkpoint is in place, `plinth.job` replaces a small marker (plinth.job.CHECKPOINT_MARKER) in the
checkpoint directory with {"step", "attempt", "time"}. The watcher stats the marker of every
watched attempt on each tick and reports a new one (by inode, mtime and size, then content) as a
CHECKPOINTED event. Markers are looked at after exits are reaped and reported before the EXITED
of the same tick, so a job that saves and exits is seen in that order. The marker holds only the
latest save: saves closer together than a tick are reported as the last of them. After a restart
the latest marker of an adopted attempt is reported again (at least once, never lost).

With fake GPUs of several models (`2xA100,2xV100`) the machine is offered as one fake node per
model (`localhost-a100`, `localhost-v100`) that share its CPUs and memory in proportion to their
GPUs; a worker's GPU indices are local to its node and mapped to the machine's numbering here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from plinth.core.errors import PlinthError
from plinth.core.net import free_port
from plinth.core.resources import MILLI, Node
from plinth.core.runtime import (
    EventKind,
    Handle,
    LaunchSpec,
    ProcRef,
    RuntimeEvent,
    WorkerLaunch,
    gang_env,
)
from plinth.runtime.gpu import GpuInfo, MpsManager, discover_gpus
from plinth.runtime.gpu import fake_gpus as make_fake_gpus
from plinth.runtime.limits import Limiter, WorkerLimits, cgroup_memory_limit_mib
from plinth.runtime.procs import (
    LOG_LIMIT_MIB,
    find_shim,
    killpg,
    read_exit,
    exit_time,
    same_process,
    start_error,
    start_shim,
    start_ticks,
    user_env,
    user_ids,
)
from plinth.runtime.watch import EventQueue, check_launch, checkpoint_events

log = logging.getLogger(__name__)

POLL_S = 0.05
MIB = 2**20
# An adopted attempt's launch time is known only from the kernel's process start times, which
# psutil derives from a boot time in whole seconds.
ADOPTED_START_SLACK_S = 1.0
# All a worker inherits from the server's environment (as Slurm's --export=NONE plus a few).
INHERITED_ENV = ("PATH", "HOME", "LANG")


@dataclass(slots=True)
class _Worker:
    rank: int
    pid: int
    start_time: float
    exit_file: str
    own: bool  # our child: reaped with waitpid; otherwise watched through `proc`
    proc: psutil.Process | None = None
    popen: subprocess.Popen | None = None
    limits: WorkerLimits = field(default_factory=WorkerLimits)
    mps_gpu: int | None = None
    done: bool = False
    code: int | None = None  # None once done: it vanished without an exit code
    killed: bool = False  # we sent SIGKILL, so a missing exit file means 137, not lost
    start_ticks: int = 0  # the kernel's start time in ticks since boot (see ProcRef)


@dataclass(slots=True)
class _Attempt:
    job_id: int
    attempt: int
    workers: list[_Worker]
    checkpoint_dir: str | None = None
    launched_at: float = 0.0  # wall clock; an older marker is not this attempt's
    ended: list[_Worker] = field(default_factory=list)  # in the order they were seen to end
    kill_at: float | None = None  # monotonic time of the SIGKILL that ends a stop's grace
    reason: str = ""
    log_path: str = ""  # where a command that could not start says why (see `_final`)
    marker_seen: tuple[int, ...] | None = None  # (inode, mtime, ctime, size) last looked at
    marker_last: tuple[int, float] | None = None  # (step, time) last reported


@dataclass(frozen=True, slots=True)
class _LocalNode:
    """A node this runtime offers: the whole machine, or one fake model group of it."""

    name: str
    gpus: tuple[int, ...]  # the machine's GPU indices, in the node's local order


class LocalRuntime(EventQueue):
    """Runs jobs as processes on this machine; see plinth.core.runtime.Runtime for the contract."""

    # A stop is SIGTERM (the job SDK's should_stop: save, then exit) and every attempt may
    # start on any of this machine's GPUs.
    capabilities = frozenset({"checkpoint", "relaunch"})

    def __init__(self, home: Path, *, fake_gpus: str | None = None,
                 notify: Callable[[], None] | None = None, node_name: str = "localhost",
                 gang_grace_s: float = 10.0, cgroup_parent: Path | None = None,
                 log_limit_mib: int = LOG_LIMIT_MIB) -> None:
        """`log_limit_mib`: a job's log is cut at this size (0: never)."""
        self.home = Path(home)
        (self.home / "exit").mkdir(parents=True, exist_ok=True)
        (self.home / "launched").mkdir(exist_ok=True)
        self.node_name = node_name
        self.gang_grace_s = gang_grace_s
        self.log_limit_mib = log_limit_mib
        self.gpus: list[GpuInfo] = make_fake_gpus(fake_gpus) if fake_gpus else discover_gpus()
        self.fake_gpus = bool(fake_gpus)
        self._nodes = _split_nodes(node_name, self.gpus, fake=self.fake_gpus)
        self.mps = MpsManager(self.home, self.gpus, fake=self.fake_gpus)
        self.mps_available = self.mps.available
        self._limiter = Limiter(cgroup_parent=cgroup_parent)
        self.isolation = self._limiter.mechanism  # "cgroup2" or "rlimit"
        self.problems: list[str] = []  # errors met by the watcher, shown by describe()
        EventQueue.__init__(self, notify)
        self._attempts: dict[tuple[int, int], _Attempt] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="plinth-local-runtime",
                                        daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- the protocol

    def nodes(self) -> list[Node]:
        cpus = len(os.sched_getaffinity(0)) or os.cpu_count() or 1
        memory = psutil.virtual_memory().total // MIB
        limit = cgroup_memory_limit_mib()
        if limit:
            memory = min(memory, limit)
        nodes = list(self._nodes.values())
        weights = [len(n.gpus) for n in nodes]
        cpu_shares = _shares(cpus * MILLI, weights)
        memory_shares = _shares(memory, weights)
        out = []
        for n, c, m in zip(nodes, cpu_shares, memory_shares, strict=True):
            model = self.gpus[n.gpus[0]].model if n.gpus else None
            out.append(Node(n.name, c, m, model, len(n.gpus)))
        return out

    def launch(self, spec: LaunchSpec) -> Handle:
        key = (spec.job_id, spec.attempt)
        launched_at = time.time()
        self._check(spec)
        with self._lock:
            if key in self._attempts:
                raise PlinthError(f"job {spec.job_id} attempt {spec.attempt}: already running")
        # The checkpoint directory is the job's to make when it first saves (plinth.job).
        d = Path(spec.log_path).parent
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PlinthError(f"job {spec.job_id} attempt {spec.attempt}: log_path: "
                              f"cannot create {d}: {e.strerror}") from None
        envs = gang_env(spec, master_addr="127.0.0.1", master_port=free_port())
        ordered = sorted(spec.workers, key=lambda w: w.rank)
        started: list[_Worker] = []
        try:
            self._write_journal(spec, started)  # before the first fork: see `find`
            for w in ordered:
                started.append(self._start(spec, w, envs[w.rank]))
                self._write_journal(spec, started)
        except Exception as e:  # noqa: BLE001 -- whatever stops a worker, none is left running
            self._journal(spec.job_id, spec.attempt).unlink(missing_ok=True)
            for wk in started:  # all or nothing
                killpg(wk.pid, signal.SIGKILL)
                os.waitpid(wk.pid, 0)
                wk.popen.returncode = -signal.SIGKILL  # type: ignore[union-attr]
                self._release(spec.job_id, spec.attempt, wk)
            rank = ordered[len(started)].rank
            raise PlinthError(f"job {spec.job_id} attempt {spec.attempt}: worker rank {rank} "
                              f"did not start: {e}") from None
        with self._lock:
            self._attempts[key] = _Attempt(spec.job_id, spec.attempt, started,
                                           spec.checkpoint_dir, launched_at,
                                           log_path=spec.log_path)
        return _handle(spec, started)

    def find(self, job_id: int, attempt: int, workers: int) -> Handle | None:
        """The handle of a launch the control plane did not live to record. A worker is known
        by the journal `launch` writes before its first fork and as each worker starts; one
        forked just before the control plane died, and not journalled yet, by its running shim
        (it names its exit file); one that has already ended, by its exit file. So a launch
        that started is never taken for one that did not, and never runs twice. A gang only
        partly started is killed."""
        path = self._journal(job_id, attempt)
        try:
            journal = Handle.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            journal = None
        known = dict(enumerate(journal.procs)) if journal else {}
        refs: list[ProcRef | None] = []
        for rank in range(workers):
            exit_file = str(self._exit_file(job_id, attempt, rank))
            ref = known.get(rank) or find_shim(exit_file)
            if ref is None and read_exit(exit_file) is not None:
                ref = ProcRef(0, 0.0, exit_file)  # it ran, and ended while no one watched
            refs.append(ref)
        if all(ref is not None for ref in refs):
            return Handle(job_id, attempt, tuple(refs),  # type: ignore[arg-type]
                          journal.checkpoint_dir if journal else None)
        for ref in refs:  # it would run on unwatched, beside the attempt that follows
            if ref is not None and same_process(ref) is not None:
                killpg(ref.pid, signal.SIGKILL)
        path.unlink(missing_ok=True)
        return None

    def stop(self, job_id: int, attempt: int, grace_s: float, *, checkpoint: bool = False
             ) -> None:
        # A real job saves on every SIGTERM it can (plinth.job): `checkpoint` changes nothing.
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is not None:  # an attempt that already ended has nothing left to stop
                self._stop(att, grace_s, f"stopped (SIGTERM, SIGKILL after {grace_s:g}s)")

    def adopt(self, handle: Handle) -> bool:
        """See Runtime.adopt; also takes a handle from `find`."""
        key = (handle.job_id, handle.attempt)
        with self._lock:
            if key in self._attempts:
                return True
        workers = [self._adopt_worker(rank, ref) for rank, ref in enumerate(handle.procs)]
        started = min((ref.start_time for ref in handle.procs), default=0.0)
        att = _Attempt(handle.job_id, handle.attempt, workers, handle.checkpoint_dir,
                       started - ADOPTED_START_SLACK_S)
        att.ended = [w for w in workers if w.done]
        if all(w.done for w in workers):
            # A checkpoint saved while no runtime watched still comes before the end, and the
            # end is dated by the exit files, not by this adoption.
            end = dataclasses.replace(self._final(att), at=exit_time(w.exit_file for w in workers))
            self._journal(*key).unlink(missing_ok=True)
            self._emit([*self._checkpoints([att], final=True), end])
            return False
        for w in workers:
            if not w.done:
                self._reattach(handle.job_id, handle.attempt, w)
        with self._lock:
            self._attempts[key] = att
            failed = next((w for w in att.ended if w.code != 0), None)
            if failed is not None:  # gang semantics hold across a restart too
                what = "vanished" if failed.code is None else f"exited with {failed.code}"
                self._stop(att, self.gang_grace_s,
                           f"rank {failed.rank} {what}; the other workers were stopped")
        return True

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self.mps.close()

    # ----------------------------------------------------------------- extras

    def describe(self) -> str:
        """One paragraph for `plinth nodes` and the startup banner: a line per node, then how
        workers are isolated and the problems met so far."""
        lines = []
        for n in self.nodes():
            gs = [self.gpus[i] for i in self._nodes[n.name].gpus]
            if gs:
                gpus = f"{len(gs)}x{gs[0].model}" + (" (fake)" if self.fake_gpus else "")
                odd = [g.name for g in gs if not g.exact]
                if odd:
                    gpus += f"; {odd[0]!r} is not in the catalog, scheduled as {gs[0].model}"
            else:
                gpus = "no GPUs"
            lines.append(f"{n.name}: {n.cpus_milli / MILLI:g} CPUs, {n.memory_mib} MiB, {gpus}")
        iso = self.isolation + (f" ({self._limiter.reason})" if self._limiter.reason else "")
        lines += [f"isolation: {iso}", f"MPS: {self.mps.reason}"]
        return "\n".join(lines + self.problems + self._limiter.problems + self.mps.problems)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def running(self) -> list[tuple[int, int]]:
        """(job_id, attempt) of every attempt still watched."""
        with self._lock:
            return sorted(self._attempts)

    # ----------------------------------------------------------------- launching

    def _check(self, spec: LaunchSpec) -> None:
        check_launch(spec, closed=self._closed.is_set(), node_is="a node here",
                     gpus_on={name: len(n.gpus) for name, n in self._nodes.items()})
        where = f"job {spec.job_id} attempt {spec.attempt}"
        if spec.run_as is not None:
            # The command and the workdir are the tenant's to name and are looked at only as
            # the tenant, by the shim's child: checked here as root, they would tell whether
            # a path the tenant cannot see exists. A bad one ends the job with 127 or 126 and
            # a line in its log.
            if os.geteuid() != 0:
                raise PlinthError(f"{where}: run_as: only a runtime running as root can run a "
                                  f"job as {spec.run_as!r}")
            try:
                user_ids(spec.run_as)
            except KeyError:
                raise PlinthError(f"{where}: run_as: no Unix user {spec.run_as!r}") from None
            except PermissionError as e:
                raise PlinthError(f"{where}: {e}") from None
            return
        exe = spec.command[0]
        path = (spec.env.get("PATH") or os.environ.get("PATH", os.defpath))
        if "/" in exe:
            found = os.access(Path(spec.workdir or ".") / exe, os.X_OK)
        else:
            found = shutil.which(exe, path=path) is not None
        if not found:
            raise PlinthError(f"{where}: command[0]: {exe!r} is not an executable"
                              + ("" if "/" in exe else " on PATH"))
        if spec.workdir and not Path(spec.workdir).is_dir():
            raise PlinthError(f"{where}: workdir: {spec.workdir!r} is not a directory")

    def _start(self, spec: LaunchSpec, w: WorkerLaunch, gang: dict[str, str]) -> _Worker:
        name = f"j{spec.job_id}-a{spec.attempt}-r{w.rank}"
        exit_file = self._exit_file(spec.job_id, spec.attempt, w.rank)
        exit_file.unlink(missing_ok=True)  # a stale file would be read as this attempt's end
        # A clean environment: never the server's own (it may hold secrets), only a short
        # allowlist, then the spec's variables, then the platform's.
        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        env["PYTHONUNBUFFERED"] = "1"  # so that `plinth logs -f` shows lines as they come
        env.update(user_env(spec.run_as))
        env.update(spec.env)
        env.update(gang)
        gpus = tuple(self._nodes[w.node].gpus[g] for g in w.gpus)  # the machine's numbering
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        wk = _Worker(w.rank, 0, 0.0, str(exit_file), own=True)
        try:
            if gpus and w.gpu_milli < MILLI:
                gpu = gpus[0]
                env.update(self.mps.acquire(gpu, (spec.job_id, spec.attempt, w.rank),
                                            w.gpu_milli, w.gpu_memory_mib))
                env["CUDA_VISIBLE_DEVICES"] = self.mps.visible_device(gpu)
                wk.mps_gpu = gpu
            wk.limits = self._limiter.prepare(name, cpus_milli=w.cpus_milli,
                                              memory_mib=w.memory_mib)
            # The platform's own variables for the shim (adoption reads its MPS pipe); what the
            # spec gives reaches only the command, after it has dropped to its user.
            shim_env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
            if wk.mps_gpu is not None:
                shim_env["CUDA_MPS_PIPE_DIRECTORY"] = env["CUDA_MPS_PIPE_DIRECTORY"]
            opts = [*wk.limits.shim_args(), "--log-limit", str(self.log_limit_mib * MIB)]
            wk.popen = start_shim(str(exit_file), command=spec.command, env=env,
                                  workdir=spec.workdir, log_path=spec.log_path, opts=opts,
                                  run_as=spec.run_as, shim_env=shim_env)
        except BaseException:
            self._release(spec.job_id, spec.attempt, wk)
            raise
        wk.pid = wk.popen.pid
        # Not reaped yet, so even a command that already ended still has its /proc entry.
        wk.start_time = psutil.Process(wk.pid).create_time()
        wk.start_ticks = start_ticks(wk.pid) or 0
        return wk

    # ----------------------------------------------------------------- adoption

    def _adopt_worker(self, rank: int, ref: ProcRef) -> _Worker:
        wk = _Worker(rank, ref.pid, ref.start_time, ref.exit_file, own=False)
        try:
            p = same_process(ref)
            if p is not None:
                wk.proc = p
                # Launched by an earlier runtime in this same process (tests, a restarted
                # control loop): it is still our child and must be reaped by us.
                wk.own = p.ppid() == os.getpid()
                if not wk.own and p.status() == psutil.STATUS_ZOMBIE:
                    wk.proc = None
        except psutil.NoSuchProcess:
            pass
        if wk.proc is None:  # gone, or the pid now belongs to another process
            wk.done, wk.code = True, read_exit(wk.exit_file)
        return wk

    def _reattach(self, job_id: int, attempt: int, wk: _Worker) -> None:
        """Count the MPS daemon and CPUs a re-adopted worker holds, to release them at its end."""
        wk.limits = self._limiter.adopt(wk.pid)
        try:
            pipe = wk.proc.environ().get("CUDA_MPS_PIPE_DIRECTORY")  # type: ignore[union-attr]
        except psutil.Error:
            return
        gpu = self.mps.gpu_of_pipe(pipe) if pipe else None
        if gpu is not None:
            self.mps.attach(gpu, (job_id, attempt, wk.rank))
            wk.mps_gpu = gpu

    # ----------------------------------------------------------------- watching

    def _watch(self) -> None:
        while not self._closed.wait(POLL_S):
            try:
                self._tick()
            except Exception as e:  # the watcher must outlive one bad tick; the error is shown
                log.exception("local runtime watcher")
                self._problem(f"watcher error: {e!r}")

    def _problem(self, msg: str) -> None:
        if msg not in self.problems[-1:]:  # a fault that repeats every tick is shown once
            self.problems[:] = [*self.problems[-19:], msg]

    def _tick(self) -> None:
        events, finished, watched, ending = [], [], [], []
        with self._lock:
            now = time.monotonic()
            for key, att in list(self._attempts.items()):
                for wk in att.workers:
                    if not wk.done and _ended(wk):
                        att.ended.append(wk)
                        finished.append((att.job_id, att.attempt, wk))
                        others = any(not o.done for o in att.workers)
                        if wk.code != 0 and others and not att.reason:
                            what = "vanished" if wk.code is None else f"exited with {wk.code}"
                            self._stop(att, self.gang_grace_s,
                                       f"rank {wk.rank} {what}; the other workers were stopped")
                if att.kill_at is not None and now >= att.kill_at:
                    att.kill_at = None
                    for wk in att.workers:
                        if not wk.done and _signal(wk, signal.SIGKILL):
                            wk.killed = True
                if all(wk.done for wk in att.workers):
                    del self._attempts[key]
                    self._journal(*key).unlink(missing_ok=True)
                    end = self._final(att)
                    if not all(wk.own for wk in att.workers):
                        # Adopted: a shim still exiting when the control plane came back may
                        # have ended long before this tick; its exit file dates the end.
                        end = dataclasses.replace(end, at=exit_time(w.exit_file for w in att.workers))
                    events.append(end)
                    ending.append(att)
                else:
                    watched.append(att)
        for job_id, attempt, wk in finished:  # may run `nvidia-cuda-mps-control`: not under lock
            self._release(job_id, attempt, wk)
        # Looked at after the exits were reaped, so that a marker written before an exit is
        # reported before it. Only this thread touches a watched attempt's marker state.
        self._emit(self._checkpoints(watched) + self._checkpoints(ending, final=True) + events)

    def _checkpoints(self, atts: list[_Attempt], *, final: bool = False) -> list[RuntimeEvent]:
        return checkpoint_events(atts, self._problem, final=final)

    def _stop(self, att: _Attempt, grace_s: float, reason: str) -> None:
        att.reason = att.reason or reason
        sig = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
        for wk in att.workers:
            # SIGTERM goes to the shim, which relays it to the group once; SIGKILL goes to the
            # whole group, since a killed shim relays nothing.
            if not wk.done and _signal(wk, sig) and sig == signal.SIGKILL:
                wk.killed = True
        deadline = time.monotonic() + grace_s
        if sig == signal.SIGTERM and (att.kill_at is None or deadline < att.kill_at):
            att.kill_at = deadline

    def _final(self, att: _Attempt) -> RuntimeEvent:
        lost = [w.rank for w in att.ended if w.code is None]
        if lost:
            return RuntimeEvent(att.job_id, att.attempt, EventKind.LOST, None,
                                f"rank {lost[0]} ended without leaving an exit code")
        code = next((w.code for w in att.ended if w.code), 0)
        reason = att.reason
        if code in (126, 127) and not reason and att.log_path:
            reason = start_error(att.log_path)
        return RuntimeEvent(att.job_id, att.attempt, EventKind.EXITED, code, reason)

    def _journal(self, job_id: int, attempt: int) -> Path:
        """Where `launch` records an attempt's workers as they start, until the attempt ends:
        a control plane killed before it stored the handle finds them here (`find`)."""
        return self.home / "launched" / f"j{job_id}-a{attempt}.json"

    def _exit_file(self, job_id: int, attempt: int, rank: int) -> Path:
        return self.home / "exit" / f"j{job_id}-a{attempt}-r{rank}.exit"

    def _write_journal(self, spec: LaunchSpec, started: list[_Worker]) -> None:
        path = self._journal(spec.job_id, spec.attempt)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(_handle(spec, started).to_dict()))
        os.replace(tmp, path)

    def _release(self, job_id: int, attempt: int, wk: _Worker) -> None:
        self._limiter.release(wk.limits)
        if wk.mps_gpu is not None:
            self.mps.release(wk.mps_gpu, (job_id, attempt, wk.rank))

def _ended(wk: _Worker) -> bool:
    """True (and `wk.code` set) once the worker's shim has ended."""
    if wk.own:
        try:
            if os.waitid(os.P_PID, wk.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return False
        except ChildProcessError:  # reaped by someone else: only the exit file can tell
            wk.done, wk.code = True, read_exit(wk.exit_file, 137 if wk.killed else None)
            return True
        # The zombie still holds the group id, so this cannot hit a reused one: it sweeps away
        # whatever the command left running.
        killpg(wk.pid, signal.SIGKILL)
        _, status = os.waitpid(wk.pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        if wk.popen is not None:
            wk.popen.returncode = rc  # so that subprocess never waits on this pid again
        # A shim killed by a signal we did not send (kill -9 from outside, the OOM killer) left
        # no exit code: the worker is lost, as it would be if we had adopted it.
        if rc >= 0:
            fallback: int | None = rc
        else:
            fallback = 128 - rc if wk.killed else None
        wk.done, wk.code = True, read_exit(wk.exit_file, fallback)
        return True
    assert wk.proc is not None
    try:
        if wk.proc.is_running() and wk.proc.status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        pass
    # What an adopted worker left in its group would run on unwatched while the job is
    # requeued: swept too. Linux reuses no pid while a group of that id has members, so the
    # group is the shim's unless a new process holds its pid (then it is left alone).
    if start_ticks(wk.pid) in (None, wk.start_ticks):
        killpg(wk.pid, signal.SIGKILL)
    wk.done, wk.code = True, read_exit(wk.exit_file, 137 if wk.killed else None)
    return True


def _split_nodes(name: str, gpus: list[GpuInfo], *, fake: bool) -> dict[str, _LocalNode]:
    """The whole machine as one node, or with fake GPUs of several models one node per model,
    named after it (`localhost-a100`), in the order the models were given."""
    models = list(dict.fromkeys(g.model for g in gpus))
    if not fake or len(models) < 2:
        return {name: _LocalNode(name, tuple(g.index for g in gpus))}
    nodes = [_LocalNode(f"{name}-{m.lower()}", tuple(g.index for g in gpus if g.model == m))
             for m in models]
    return {n.name: n for n in nodes}


def _shares(total: int, weights: list[int]) -> list[int]:
    """`total` split in proportion to `weights` (equally when all are 0), summing to `total`."""
    if not any(weights):
        weights = [1] * len(weights)
    shares = [total * w // sum(weights) for w in weights]
    shares[0] += total - sum(shares)
    return shares


def _signal(wk: _Worker, sig: int) -> bool:
    """SIGTERM to the worker's shim, SIGKILL to its whole group; False if it is already gone."""
    if not wk.own and (wk.proc is None or not wk.proc.is_running()):
        return False  # its pid may have been reused: never signal what we cannot identify
    try:
        if sig == signal.SIGKILL:
            os.killpg(wk.pid, sig)
        else:
            os.kill(wk.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _handle(spec: LaunchSpec, started: list[_Worker]) -> Handle:
    return Handle(spec.job_id, spec.attempt,
                  tuple(ProcRef(w.pid, w.start_time, w.exit_file, w.start_ticks) for w in started),
                  spec.checkpoint_dir)
