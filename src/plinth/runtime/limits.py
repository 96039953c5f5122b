"""CPU and memory limits for a worker: cgroup v2 where the machine lets us, rlimits otherwise.

cgroup v2 needs a writable cgroup2 hierarchy with the cpu and memory controllers available to
us. Each worker then gets its own child cgroup with `cpu.max` (a quota of `cpus_milli`) and
`memory.max`, which the kernel enforces for the worker and everything it starts.

Without it (a cgroup v1 or hybrid host, or no delegation), the worker gets RLIMIT_DATA for memory
and a CPU affinity mask of ceil(cpus_milli / 1000) CPUs. RLIMIT_DATA and not RLIMIT_AS: measured
here, `import torch` and a matmul fail under RLIMIT_AS = 512 MiB (OpenBLAS reserves address
space per thread) but run under RLIMIT_DATA = 512 MiB, which counts memory that is written to.
Both are per process, so a worker that forks gets a fresh allowance per child: weaker than a cgroup,
which is why `isolation` reports which one is in force.

The limits are applied by the shim to itself before it starts the command (the command inherits
them), not in a `preexec_fn`: forking a multi-threaded control plane and running Python before
exec is unsafe, and joining the cgroup from inside means the command never runs outside it.
"""

from __future__ import annotations

import errno
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil

MIB = 2**20
CGROUP_PERIOD_US = 100_000  # the kernel's default cpu.max period


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """What the shim applies to itself: a cgroup to join, or an rlimit and an affinity mask."""

    cgroup: str = ""
    memory_mib: int = 0  # rlimit path only; the cgroup path writes memory.max instead
    cpus: tuple[int, ...] = ()  # rlimit path only

    def shim_args(self) -> list[str]:
        args = []
        if self.cgroup:
            args += ["--cgroup", self.cgroup]
        if self.memory_mib:
            args += ["--memory-mib", str(self.memory_mib)]
        if self.cpus:
            args += ["--cpus", ",".join(map(str, self.cpus))]
        return args


def cgroup_quota(cpus_milli: int) -> str:
    """`cpu.max` for a share in milli-CPUs: 1500 -> "150000 100000" (1.5 CPUs per period)."""
    return f"{cpus_milli * CGROUP_PERIOD_US // 1000} {CGROUP_PERIOD_US}"


def find_cgroup2_parent() -> tuple[Path | None, str]:
    """The cgroup under which per-worker cgroups can be made, or None and the reason why not."""
    mounts = [line.split()[1] for line in _read("/proc/self/mounts").splitlines()
              if len(line.split()) > 2 and line.split()[2] == "cgroup2"]
    if not mounts:
        return None, "no cgroup2 mount"
    own = next((line[3:] for line in _read("/proc/self/cgroup").splitlines()
                if line.startswith("0::")), None)
    if own is None:
        return None, "this process is in no cgroup2 group"
    parent = Path(mounts[0]) / own.lstrip("/")
    controllers = _read(parent / "cgroup.controllers").split()
    if not {"cpu", "memory"} <= set(controllers):
        return None, (f"cgroup2 at {parent} lacks the cpu and memory controllers "
                      f"(has: {' '.join(controllers) or 'none'}; they are bound to cgroup v1)")
    return parent, ""


def cgroup_memory_limit_mib() -> int:
    """The memory limit of the cgroup this process runs in (a container's), 0 if none."""
    for line in _read("/proc/self/cgroup").splitlines():
        hid, ctrls, path = line.split(":", 2)
        if hid == "0":
            f = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max"
        elif "memory" in ctrls.split(","):
            f = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"
        else:
            continue
        text = _read(f).strip()
        if text.isdigit() and int(text) < 2**60:
            return int(text) // MIB
    return 0


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


class Limiter:
    """Makes and removes per-worker limits. `mechanism` is "cgroup2" or "rlimit", `reason` says
    why the cgroup path is not used where it is not."""

    def __init__(self, *, cgroup_parent: Path | None = None) -> None:
        self._allowed = sorted(os.sched_getaffinity(0))
        self._load = dict.fromkeys(self._allowed, 0)  # workers pinned to each CPU
        self._lock = threading.Lock()
        self._base: Path | None = None
        self.problems: list[str] = []
        parent, why = (cgroup_parent, "") if cgroup_parent else find_cgroup2_parent()
        if parent is not None:
            self._base, why = _enable(parent)
        self.mechanism = "cgroup2" if self._base else "rlimit"
        self.reason = why

    def prepare(self, name: str, *, cpus_milli: int, memory_mib: int) -> WorkerLimits:
        """Limits for one worker; `name` is unique per worker (job, attempt, rank)."""
        if not cpus_milli and not memory_mib:
            return WorkerLimits()
        if self._base is not None:
            cg = self._base / name
            cg.mkdir(exist_ok=True)
            if cpus_milli:
                (cg / "cpu.max").write_text(cgroup_quota(cpus_milli))
            if memory_mib:
                (cg / "memory.max").write_text(str(memory_mib * MIB))
                # Without this a worker over its limit swaps instead of failing.
                _try_write(cg / "memory.swap.max", "0")
            return WorkerLimits(cgroup=str(cg))
        cpus: tuple[int, ...] = ()
        if cpus_milli:
            k = min(math.ceil(cpus_milli / 1000), len(self._allowed))
            with self._lock:  # the least loaded CPUs, so that workers spread over the machine
                cpus = tuple(sorted(sorted(self._allowed, key=lambda c: (self._load[c], c))[:k]))
                for c in cpus:
                    self._load[c] += 1
        return WorkerLimits(memory_mib=memory_mib, cpus=cpus)

    def adopt(self, pid: int) -> WorkerLimits:
        """The limits of a running worker started by an earlier runtime, so that they are
        released when it ends."""
        try:
            proc = psutil.Process(pid)
            if self._base is not None:
                own = next((line[3:] for line in _read(f"/proc/{pid}/cgroup").splitlines()
                            if line.startswith("0::")), "")
                name = own.rstrip("/").rsplit("/", 1)[-1]
                cg = self._base / name
                return WorkerLimits(cgroup=str(cg)) if name and cg.is_dir() else WorkerLimits()
            cpus = tuple(sorted(proc.cpu_affinity()))
        except psutil.Error:
            return WorkerLimits()
        if set(cpus) >= set(self._allowed) or not set(cpus) <= set(self._allowed):
            return WorkerLimits()
        with self._lock:
            for c in cpus:
                self._load[c] += 1
        return WorkerLimits(cpus=cpus)

    def release(self, limits: WorkerLimits) -> None:
        """Undo `prepare` once the worker has exited: free its CPUs, remove its cgroup (killing
        anything the worker left behind in it first, so that the cgroup is empty)."""
        if limits.cpus:
            with self._lock:
                for c in limits.cpus:
                    self._load[c] = max(0, self._load[c] - 1)
        if limits.cgroup:
            cg = Path(limits.cgroup)
            _try_write(cg / "cgroup.kill", "1")
            try:
                cg.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                # EBUSY: leftovers are still dying. The worker has ended either way, so this is
                # reported (describe()) rather than raised into the watcher or a failed launch.
                self.problems.append(f"cannot remove cgroup {cg}: {e.strerror}")


def _enable(parent: Path) -> tuple[Path | None, str]:
    """Make `parent/plinth` with cpu and memory delegated to its children."""
    base = parent / "plinth"
    try:
        enabled = _read(parent / "cgroup.subtree_control").split()
        if not {"cpu", "memory"} <= set(enabled):
            (parent / "cgroup.subtree_control").write_text("+cpu +memory")
        base.mkdir(exist_ok=True)
        (base / "cgroup.subtree_control").write_text("+cpu +memory")
    except OSError as e:
        hint = (" (the cgroup holds processes; cgroup v2 only lets a leaf hold them)"
                if e.errno == errno.EBUSY else "")
        return None, f"cannot delegate cpu and memory under {parent}: {e.strerror}{hint}"
    return base, ""


def _try_write(path: Path, text: str) -> None:
    """Write an optional cgroup knob; older kernels lack some (cgroup.kill came in 5.14)."""
    try:
        path.write_text(text)
    except FileNotFoundError:
        pass
