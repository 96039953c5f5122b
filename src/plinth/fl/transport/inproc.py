"""In-process transports for simulation and tests. Messages still go through `serde` as bytes.

- `ThreadTransport` runs given `ClientRunner`s in a thread pool (tests, tiny federations).
- `PoolTransport` runs an app's virtual clients in a process pool (`plinth.runtime.pool`): each
  worker loads the app and its data split once, then builds the client for whichever id a task
  names. With `sticky` every client id has one worker process of its own (id mod workers), so
  state a client keeps in memory between messages (a SecAgg+ round's keys and shares) is there
  for its next one.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from plinth.fl.client import AppClients, ClientRunner
from plinth.fl.messages import ClientInfo
from plinth.runtime.pool import process_pool


class ThreadTransport:
    """Real `ClientRunner`s called from threads; the bytes are copied as a socket would."""

    landing: Any = None  # replies come back whole, never landed
    max_reply: int | None = None  # from processes of ours, not off a network: no limit

    def __init__(self, runners: dict[str, ClientRunner],
                 properties: dict[str, dict[str, Any]] | None = None, threads: int = 4) -> None:
        self.runners = runners
        self.properties = properties or {}
        self._pool = ThreadPoolExecutor(threads)

    def clients(self) -> list[ClientInfo]:
        return [ClientInfo(cid, dict(self.properties.get(cid, {}))) for cid in self.runners]

    def wait_for(self, n: int, timeout: float) -> bool:
        return len(self.runners) >= n

    def submit(self, cid: str, payload: bytes | bytearray) -> Future:
        runner = self.runners[cid]
        return self._pool.submit(lambda: bytes(runner.handle(bytes(payload))))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


_WORKER: dict[str, Any] = {}


def _init_worker(app_path: str, overrides: dict[str, Any], num_clients: int,
                 state_dir: str | None) -> None:
    import torch

    from plinth.fl.app import load_app

    torch.set_num_threads(1)  # one core per virtual client; the pool gives the parallelism
    spec = load_app(app_path, overrides)
    _WORKER["clients"] = AppClients(spec, num_clients, state_dir, simulated=True)


def _run_task(cid: str, payload: bytes) -> bytes:
    return bytes(_WORKER["clients"].runner(int(cid)).handle(payload))


class PoolTransport:
    """Virtual clients ``0 … num_clients-1`` of the app at `app_path`, in `workers` processes.

    By default any idle worker takes the next task. `sticky` gives each worker process its own
    single-process pool and sends client id c to pool c mod workers, always the same process.
    """

    landing: Any = None  # replies come back whole, never landed
    max_reply: int | None = None  # from processes of ours, not off a network: no limit

    def __init__(self, app_path: str, overrides: dict[str, Any], num_clients: int,
                 sizes: list[int], *, workers: int | None = None,
                 state_dir: str | None = None, sticky: bool = False) -> None:
        self.num_clients, self.sizes = num_clients, sizes
        self._workers = workers or max(1, min(num_clients, os.cpu_count() or 1))
        self._init = (app_path, overrides, num_clients, state_dir)
        self._per_pool = 1 if sticky else self._workers
        self._pools = [self._start(self._per_pool)
                       for _ in range(self._workers // self._per_pool)]

    def _start(self, processes: int) -> ProcessPoolExecutor:
        return process_pool(processes, _init_worker, self._init)

    def clients(self) -> list[ClientInfo]:
        return [ClientInfo(str(i), {"num_examples": n}) for i, n in enumerate(self.sizes)]

    def wait_for(self, n: int, timeout: float) -> bool:
        return self.num_clients >= n

    def submit(self, cid: str, payload: bytes | bytearray) -> Future:
        k = int(cid) % len(self._pools)
        try:
            return self._pools[k].submit(_run_task, cid, bytes(payload))
        except BrokenProcessPool:
            # A client killed its worker (its tasks already failed as "lost"): start a new pool.
            self._pools[k].shutdown(wait=False, cancel_futures=True)
            self._pools[k] = self._start(self._per_pool)
            return self._pools[k].submit(_run_task, cid, bytes(payload))

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=True, cancel_futures=True)
