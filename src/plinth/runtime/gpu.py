"""GPUs on this machine: discovery with NVML, `--fake-gpus`, and the MPS daemons that enforce
fractional shares.

A fractional worker (gpu_milli < 1000) runs as a client of an MPS control daemon that owns its
GPU. The daemon is private to this runtime (its own pipe and log directories), is started on the
first fractional use of a GPU, and is told to quit when no job uses that GPU fractionally any more.
Each client gets its SM share (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) and memory limit
(`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) in its environment, which MPS enforces.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from plinth.core.errors import PlinthError, SpecError
from plinth.core.gpus import GPU_CATALOG, gpu_model

MPS_CONTROL = "nvidia-cuda-mps-control"
# Unix socket paths are limited to 108 bytes and MPS puts its sockets inside the pipe directory,
# so a pipe directory deep inside a long home path is moved under the temp directory.
_MAX_PIPE_DIR = 80
_FAKE = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9-]*)\s*$")
_FAMILY = re.compile(r"(?<![A-Za-z0-9])(H200|H100|A100|A10|V100|T4|P100|K80)(?![A-Za-z0-9])",
                     re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int  # NVML index, the same numbering as CUDA_VISIBLE_DEVICES
    name: str  # as NVML reports it, e.g. "NVIDIA H200"
    model: str  # the GPU_CATALOG name that Plinth schedules with, e.g. "H200"
    memory_mib: int
    uuid: str = ""
    exact: bool = True  # False when `name` is not in the catalog and `model` is the nearest guess


def catalog_model(name: str, memory_mib: int) -> tuple[str, bool]:
    """The catalog model for an NVML device name: ("H200", True) for "NVIDIA H200".

    Variants of one family (A100 80 GB and 40 GB, V100 16 and 32 GB) are told apart by memory.
    A device outside the catalog gets the catalog model nearest in memory and `exact=False`, so
    that the scheduler still has a memory size and a speed to work with.
    """
    m = _FAMILY.search(name)
    if m:
        fam = m.group(1).upper()
        variants = [g for g in GPU_CATALOG.values()
                    if g.name == fam or (g.name.startswith(fam) and g.name[len(fam)] in "-M")]
        best = min(variants, key=lambda g: abs(g.memory_mib - memory_mib))
        return best.name, True
    named = [g for g in GPU_CATALOG.values() if not g.name.startswith("G")]  # not Alibaba's G1..G3
    return min(named, key=lambda g: abs(g.memory_mib - memory_mib)).name, False


def discover_gpus() -> list[GpuInfo]:
    """The GPUs NVML sees; [] when nvidia-ml-py, the NVML library or the driver is missing."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no libnvidia-ml.so or no driver: a machine without GPUs
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(pynvml.nvmlDeviceGetName(h))
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20
            model, exact = catalog_model(name, mem)
            out.append(GpuInfo(i, name, model, mem, _text(pynvml.nvmlDeviceGetUUID(h)), exact))
        return out
    except pynvml.NVMLError as e:
        raise PlinthError(f"NVML: cannot list GPUs: {e}") from None
    finally:
        pynvml.nvmlShutdown()


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v  # older nvidia-ml-py returns bytes


def parse_fake_gpus(value: str) -> tuple[int, str]:
    """One group of `--fake-gpus`: `4xA100` -> (4, "A100")."""
    m = _FAKE.match(value or "")
    if m is None:
        raise SpecError(f"--fake-gpus: expected COUNTxMODEL such as 4xA100, got {value!r}")
    count = int(m.group(1))
    if count < 1:
        raise SpecError(f"--fake-gpus: the count must be at least 1, got {value!r}")
    try:
        return count, gpu_model(m.group(2)).name
    except SpecError as e:
        raise SpecError(f"--fake-gpus: {e}") from None


def parse_fake_gpu_groups(value: str) -> list[tuple[int, str]]:
    """`--fake-gpus 2xA100,2xV100` -> [(2, "A100"), (2, "V100")]: one group per GPU model, in
    the order given. The local runtime makes one fake node of each group."""
    parts = (value or "").split(",")
    groups = []
    for part in parts:
        try:
            groups.append(parse_fake_gpus(part))
        except SpecError as e:
            raise SpecError(f"{e} (in {value!r})" if len(parts) > 1 else str(e)) from None
    seen: set[str] = set()
    for _, model in groups:
        if model in seen:
            raise SpecError(f"--fake-gpus: model {model} is given twice in {value!r}; "
                            f"give each model once with its total count")
        seen.add(model)
    return groups


def fake_gpus(value: str) -> list[GpuInfo]:
    """Virtual GPUs, numbered from 0 across all groups in the order given."""
    out: list[GpuInfo] = []
    for count, model in parse_fake_gpu_groups(value):
        mem = GPU_CATALOG[model].memory_mib
        out += [GpuInfo(len(out) + i, f"fake {model}", model, mem) for i in range(count)]
    return out


def mps_env(pipe_dir: Path, gpu_milli: int, gpu_memory_mib: int) -> dict[str, str]:
    """What an MPS client needs: the daemon's pipe, its SM share and its memory limit.

    MPS takes a whole percentage of SMs; a share below 1% still gets 1%. The memory limit names
    device 0 because the client sees only its one GPU.
    """
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, round(gpu_milli / 10)))}
    if gpu_memory_mib:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={gpu_memory_mib}M"
    return env


class MpsManager:
    """One MPS control daemon per GPU used fractionally, counted by the attempts that use it.

    When there is no `nvidia-cuda-mps-control` binary, or the GPUs are fake, the clients still
    get their environment (so it can be tested) but no daemon is started; `available` says which.
    """

    def __init__(self, home: Path, gpus: list[GpuInfo], *, fake: bool) -> None:
        self._home = home
        self._gpus = {g.index: g for g in gpus}
        self._binary = None if fake else shutil.which(MPS_CONTROL)
        self.available = self._binary is not None
        if fake:
            self.reason = "GPUs are fake: MPS variables are set, no daemon is started"
        elif not self.available:
            self.reason = f"{MPS_CONTROL} not found: MPS variables are set, no daemon is started"
        else:
            self.reason = "MPS daemons start on the first fractional use of a GPU"
        self._users: dict[int, set[tuple[int, int, int]]] = {}
        self._running: set[int] = set()
        self.problems: list[str] = []
        self._lock = threading.Lock()

    def pipe_dir(self, gpu: int) -> Path:
        d = self._home / "mps" / f"gpu{gpu}" / "pipe"
        if len(str(d)) > _MAX_PIPE_DIR:
            tag = hashlib.sha1(str(self._home).encode()).hexdigest()[:10]
            d = Path(tempfile.gettempdir()) / f"plinth-mps-{tag}" / f"gpu{gpu}"
        return d

    def log_dir(self, gpu: int) -> Path:
        return self._home / "mps" / f"gpu{gpu}" / "log"

    def gpu_of_pipe(self, pipe_dir: str) -> int | None:
        """The GPU whose daemon listens on `pipe_dir` (for re-adopted clients)."""
        return next((g for g in self._gpus if str(self.pipe_dir(g)) == pipe_dir), None)

    def visible_device(self, gpu: int) -> str:
        """CUDA_VISIBLE_DEVICES for a client of the daemon on `gpu`. A daemon renumbers the GPUs
        it sees from 0, so an index would be wrong for the client; the UUID is the same in both."""
        info = self._gpus.get(gpu)
        return info.uuid if self.available and info and info.uuid else str(gpu)

    def acquire(self, gpu: int, user: tuple[int, int, int], gpu_milli: int,
                gpu_memory_mib: int) -> dict[str, str]:
        """Start the daemon for `gpu` if this is its first user; return the client environment."""
        with self._lock:
            if self.available and gpu not in self._running:
                self._start(gpu)
            self._users.setdefault(gpu, set()).add(user)
        return mps_env(self.pipe_dir(gpu), gpu_milli, gpu_memory_mib)

    def attach(self, gpu: int, user: tuple[int, int, int]) -> None:
        """Count a re-adopted client, whose daemon an earlier runtime started."""
        with self._lock:
            self._users.setdefault(gpu, set()).add(user)
            if self.available and (self.pipe_dir(gpu) / "control").exists():
                self._running.add(gpu)

    def release(self, gpu: int, user: tuple[int, int, int]) -> None:
        """Forget one user; quit the daemon when it was the last."""
        with self._lock:
            users = self._users.get(gpu, set())
            users.discard(user)
            if not users:
                self._users.pop(gpu, None)
                if gpu in self._running:
                    self._quit(gpu)

    def close(self) -> None:
        """Quit the daemons no job uses; those with clients keep serving them."""
        with self._lock:
            for gpu in sorted(self._running - set(self._users)):
                self._quit(gpu)

    def daemons(self) -> list[int]:
        with self._lock:
            return sorted(self._running)

    def _env(self, gpu: int) -> dict[str, str]:
        info = self._gpus.get(gpu)
        device = info.uuid if info and info.uuid else str(gpu)
        return {**os.environ, "CUDA_VISIBLE_DEVICES": device,
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu)),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(gpu))}

    def _start(self, gpu: int) -> None:
        self.pipe_dir(gpu).mkdir(parents=True, exist_ok=True)
        self.log_dir(gpu).mkdir(parents=True, exist_ok=True)
        out_path = self.log_dir(gpu) / "start.out"
        # Output goes to a file, not a pipe: the daemon forks, and a child that kept the pipe's
        # write end open would make us wait for it forever.
        with open(out_path, "w") as out:
            r = subprocess.run([self._binary, "-d"], check=False, env=self._env(gpu),
                               stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                               timeout=30)
        # A daemon left by a runtime that crashed still owns the pipe: reuse it.
        if r.returncode != 0 and not (self.pipe_dir(gpu) / "control").exists():
            msg = out_path.read_text().strip().splitlines()
            raise PlinthError(f"MPS daemon for GPU {gpu} did not start (exit {r.returncode}): "
                              f"{msg[-1] if msg else 'no output'}")
        self._running.add(gpu)

    def _quit(self, gpu: int) -> None:
        # Called from the runtime's watcher when a job ends: a failure to stop a daemon must not
        # stop the watcher, so it is kept in `problems` (shown by describe()) instead of raised.
        self._running.discard(gpu)
        try:
            r = subprocess.run([self._binary], check=False, input="quit\n", env=self._env(gpu),
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            self.problems.append(f"MPS daemon for GPU {gpu}: quit failed: {e}")
            return
        if r.returncode != 0:
            self.problems.append(f"MPS daemon for GPU {gpu}: quit exited {r.returncode}")
