"""Virtual clients as Ray actors, for `plinth fl sim --backend ray` (as Flower's simulation
engine runs them).

`RayTransport` has `PoolTransport`'s interface. It starts N actors, "client engines", each
reserving `client_cpus` CPUs and a `client_gpus` share of a GPU from Ray; each loads the app
and its data split once (`AppClients`) and then runs whichever client a task names. Messages
go through `serde` as bytes, as with the pool; a payload sent to many clients is put in Ray's
object store once.

One dispatcher thread owns every piece of state. `submit` returns a concurrent Future at once
and queues the task; the dispatcher hands it to an actor with a free slot (each actor holds
`depth` tasks, so the next one is already there when it finishes one) or, with `sticky`, to
actor c mod N always, so state a client keeps in memory (a SecAgg+ round's keys) is there
for its next message. A task cancelled before it reached an actor is never sent. When an
actor dies, its tasks fail as a lost client would, and a new actor takes its place.

The Ray session (a cluster joined, or a private local Ray) and the actors are started by
`plinth.runtime.pool`.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from plinth.core.errors import PlinthError
from plinth.fl.messages import ClientInfo
from plinth.runtime.pool import ray_actor
from plinth.runtime.ray_connect import one_line

READY_TIMEOUT_S = 300.0  # how long the actors may take to load the app
DEPTH = 2  # tasks held by one actor at a time: the one it runs and the next


class ClientEngine:
    """The actor: one app, its data split and `AppClients`, loaded once; any client on call."""

    def __init__(self, app_path: str, overrides: dict[str, Any], num_clients: int,
                 state_dir: str | None, threads: int) -> None:
        import torch

        from plinth.fl.app import load_app
        from plinth.fl.client import AppClients

        torch.set_num_threads(threads)  # the CPUs Ray reserved for this actor
        spec = load_app(app_path, overrides)
        self.clients = AppClients(spec, num_clients, state_dir, simulated=True)

    def ready(self) -> int:
        return os.getpid()

    def run(self, cid: str, payload: bytes) -> bytes:
        return bytes(self.clients.runner(int(cid)).handle(payload))


@dataclass(slots=True)
class _Task:
    cid: str
    payload: Any  # an ObjectRef to the bytes
    future: Future


class RayTransport:
    """Virtual clients ``0 … num_clients-1`` of the app at `app_path`, on `actors` Ray actors
    (default: as many as the cluster's CPUs and GPUs hold, at most one per client).
    Ray must be connected (`plinth.runtime.pool.ray_session`)."""

    landing: Any = None  # replies come back whole, never landed
    max_reply: int | None = None  # from processes of ours, not off a network: no limit

    def __init__(self, app_path: str, overrides: dict[str, Any], num_clients: int,
                 sizes: list[int], *, actors: int | None = None, client_cpus: float = 1.0,
                 client_gpus: float = 0.0, state_dir: str | None = None,
                 sticky: bool = False, depth: int = DEPTH) -> None:
        import ray

        self._ray = ray
        self.num_clients, self.sizes, self.sticky, self.depth = num_clients, sizes, sticky, depth
        # The cluster's whole resources, not the free ones: a run's actors just killed free
        # theirs a moment later, and actors that do not fit yet wait (up to READY_TIMEOUT_S).
        fit = fitting_actors(ray.cluster_resources(), num_clients, client_cpus=client_cpus,
                             client_gpus=client_gpus)
        if actors is not None and actors > fit:
            raise PlinthError(f"--workers {actors}: the Ray cluster holds {fit} client actors "
                              f"of {client_cpus:g} CPUs and {client_gpus:g} GPUs")
        n = actors or fit
        self._cls = ray_actor(ClientEngine, cpus=client_cpus, gpus=client_gpus)
        self._init = (app_path, overrides, num_clients, state_dir,
                      max(1, math.floor(client_cpus)))
        self._actors = [self._cls.remote(*self._init) for _ in range(n)]
        self._gen = [0] * n  # bumped when actor k is replaced: late news of the old one is old
        self._busy = [0] * n
        self._lanes = [deque() for _ in range(n if sticky else 1)]
        self._running: set[Future] = set()  # the futures of tasks an actor holds
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._last: tuple[Any, Any] = (None, None)  # the last payload and its object ref
        self.replaced = 0  # actors started in place of dead ones
        self._wait_ready(n)
        self._thread = threading.Thread(target=self._dispatch, name="plinth-fl-ray",
                                        daemon=True)
        self._thread.start()

    def _wait_ready(self, n: int) -> None:
        ray = self._ray
        refs = [a.ready.remote() for a in self._actors]
        done, _ = ray.wait(refs, num_returns=n, timeout=READY_TIMEOUT_S)
        if len(done) < n:
            self._kill_all()
            raise PlinthError(f"--backend ray: {n - len(done)} of {n} client actors did not "
                              f"start within {READY_TIMEOUT_S:g}s (not enough free CPUs or "
                              f"GPUs in the Ray cluster?)")
        try:
            ray.get(done)
        except ray.exceptions.RayError as e:
            self._kill_all()
            raise PlinthError(f"--backend ray: a client actor failed to load the app: "
                              f"{one_line(e)}") from None

    # --------------------------------------------------------------- the transport interface

    def clients(self) -> list[ClientInfo]:
        return [ClientInfo(str(i), {"num_examples": n}) for i, n in enumerate(self.sizes)]

    def wait_for(self, n: int, timeout: float) -> bool:
        return self.num_clients >= n

    def submit(self, cid: str, payload: bytes | bytearray) -> Future:
        if payload is not self._last[0]:  # a round's broadcast is one object, put once
            self._last = (payload, self._ray.put(bytes(payload)))
        fut: Future = Future()
        self._events.put(("submit", _Task(cid, self._last[1], fut)))
        return fut

    def close(self) -> None:
        if self._thread.is_alive():
            self._events.put(("close", None))
            self._thread.join()

    # --------------------------------------------------------------- the dispatcher

    def _dispatch(self) -> None:
        while True:
            kind, item = self._events.get()
            if kind == "close":
                self._shut()
                return
            if kind == "submit":
                lane = int(item.cid) % len(self._lanes)
                self._lanes[lane].append(item)
            else:
                self._finished(*item)
            self._pump()

    def _pump(self) -> None:
        """Give queued tasks to actors with a free slot, the least busy first."""
        for k in sorted(range(len(self._actors)), key=self._busy.__getitem__):
            lane = self._lanes[k if self.sticky else 0]
            while lane and self._busy[k] < self.depth:
                task = lane.popleft()
                if task.future.set_running_or_notify_cancel():  # False: cancelled while queued
                    self._send(k, task)

    def _send(self, k: int, task: _Task) -> None:
        ref = self._actors[k].run.remote(task.cid, task.payload)
        self._busy[k] += 1
        self._running.add(task.future)
        gen, out = self._gen[k], task.future
        ref.future().add_done_callback(
            lambda inner: self._events.put(("done", (k, gen, task.cid, out, inner))))

    def _finished(self, k: int, gen: int, cid: str, out: Future, inner: Future) -> None:
        self._running.discard(out)
        err = inner.exception()
        if gen == self._gen[k]:
            self._busy[k] -= 1
            if isinstance(err, self._ray.exceptions.RayActorError):
                self._replace(k)
        if out.done():
            return
        if err is None:
            out.set_result(inner.result())
        elif isinstance(err, self._ray.exceptions.RayActorError):
            out.set_exception(ConnectionError(f"client {cid}: its Ray actor died"))
        else:  # the client's own exception, as the pool gives it, without Ray's traceback
            out.set_exception(getattr(err, "cause", None) or err)

    def _replace(self, k: int) -> None:
        """Actor k died: its other tasks fail on their own; a new actor takes its slot."""
        logging.getLogger(__name__).warning("client actor %d died; starting a new one", k)
        self._kill(self._actors[k])
        self._actors[k] = self._cls.remote(*self._init)
        self._gen[k] += 1
        self._busy[k] = 0
        self.replaced += 1

    def _shut(self) -> None:
        for lane in self._lanes:
            for task in lane:
                task.future.cancel()
            lane.clear()
        for out in list(self._running):
            if not out.done():
                out.set_exception(ConnectionError("the Ray transport was closed"))
        self._running.clear()
        self._kill_all()

    def _kill_all(self) -> None:
        for a in self._actors:
            self._kill(a)

    def _kill(self, actor: Any) -> None:
        try:
            self._ray.kill(actor, no_restart=True)
        except self._ray.exceptions.RayError:
            pass  # already gone


def fitting_actors(total: dict[str, float], num_clients: int, *, client_cpus: float,
                   client_gpus: float) -> int:
    """How many client actors the cluster's resources hold (at most one per client);
    one-line errors when not a single one fits."""
    if client_gpus > 0 and total.get("GPU", 0) <= 0:
        raise PlinthError(f"--client-gpus {client_gpus:g}: the Ray cluster has no GPUs (no "
                          f"node offers the GPU resource)")
    fits = [total.get("CPU", 0) / client_cpus] if client_cpus > 0 else []
    if client_gpus > 0:
        fits.append(total.get("GPU", 0) / client_gpus)
    n = min(num_clients, math.floor(min(fits) + 1e-9)) if fits else num_clients
    if n < 1:
        raise PlinthError(f"--client-cpus {client_cpus:g} --client-gpus {client_gpus:g}: the "
                          f"Ray cluster has {total.get('CPU', 0):g} CPUs and "
                          f"{total.get('GPU', 0):g} GPUs, not enough for one client")
    return n
