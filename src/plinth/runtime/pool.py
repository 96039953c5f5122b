"""Helper processes of one program, started in one place: `plinth fl sim`'s virtual clients
(a process pool, or Ray actors), the leaf aggregators an FL server starts for itself, and
`plinth fl admm`'s sites on loopback.

These are not the scheduler's units. In a deployed task every process (the server, its middles,
its leaves) is a unit that a runtime starts as a job. What is here runs beside one process, on
this machine or on the Ray cluster it joins, and ends with it:

- `spawn(target, *args)`: one process running `target(*args)`, from a fresh interpreter
  ("spawn"), or forked from a fork server that has imported `preload` once ("forkserver");
- `process_pool(workers, initializer, initargs)`: a pool of spawned processes;
- `ray_session(address)`: Ray, joined at `address`, or the Ray this process already has, or a
  private local Ray started here and stopped at the end;
- `ray_actor(cls, cpus=, gpus=)`: the Ray actor class of `cls`; each `.remote(...)` starts one.

Never fork this process itself: it may hold gRPC, torch or BLAS threads, and a fork of a process
with threads can hang.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any, Literal

from plinth.core.errors import PlinthError

OBJECT_STORE_BYTES = 512 * 2**20  # a private Ray's object store; the payloads are small


def spawn(target: Callable[..., Any], *args: Any,
          method: Literal["spawn", "forkserver"] = "spawn",
          preload: Sequence[str] = ()) -> BaseProcess:
    """A started daemon process running `target(*args)` (a module-level function; `args` are
    pickled, pipe ends included). With "forkserver", the fork server imports `preload` when it
    starts (the first such process), so that each process forked from it need not."""
    ctx = mp.get_context(method)
    if preload:
        ctx.set_forkserver_preload(list(preload))  # counts only before the server starts
    proc = ctx.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def process_pool(workers: int, initializer: Callable[..., Any] | None = None,
                 initargs: tuple = ()) -> ProcessPoolExecutor:
    """`workers` spawned processes, each running `initializer(*initargs)` first."""
    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                               initializer=initializer, initargs=initargs)


@contextmanager
def ray_session(address: str | None, *, num_cpus: int | None = None,
                object_store_bytes: int = OBJECT_STORE_BYTES) -> Iterator[Any]:
    """Ray, connected to the cluster at `address` (HOST:PORT or auto) or, without one, to the
    Ray this process already has or else a private local Ray of `num_cpus` CPUs; what this
    started or joined is stopped or left at the end."""
    tmp, owned = None, False
    try:
        if address:
            from plinth.runtime.ray_connect import NAMESPACE, connect_ray

            # not imported here: the loopback switch must be set before Ray is first imported
            before = sys.modules.get("ray")
            owned = before is None or not before.is_initialized()
            ray = connect_ray(address, NAMESPACE)
        elif (ray := sys.modules.get("ray")) is not None and ray.is_initialized():
            pass  # this process already has a Ray (a notebook's ray.init, a test's): use it
        else:
            ray = _ray_or_none()
            if ray is None:
                raise PlinthError("--backend ray: Ray is not installed; pip install "
                                  "'ray[default]'")
            # A short folder of its own: Ray's socket paths must fit in 107 bytes, and other
            # Rays on this machine keep theirs in /tmp/ray.
            tmp = tempfile.mkdtemp(prefix="plfl-", dir="/tmp")
            ray.init(num_cpus=num_cpus or os.cpu_count(), object_store_memory=object_store_bytes,
                     include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR, _temp_dir=tmp)
            owned = True
        yield ray
    finally:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized() and (tmp or owned):
            ray.shutdown()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def ray_actor(cls: type, *, cpus: float, gpus: float = 0.0) -> Any:
    """`cls` as a Ray actor class in the session (`ray_session`): each `.remote(*args)` starts
    one actor that reserves `cpus` CPUs and a `gpus` share of a GPU, never restarted by Ray (its
    owner replaces it)."""
    import ray

    return ray.remote(num_cpus=cpus, num_gpus=gpus, max_restarts=0)(cls)


def _ray_or_none() -> Any:
    try:
        import ray
    except ImportError:
        return None
    return ray
