"""Run ADMM sites as separate processes that talk over 127.0.0.1 (multiprocessing.connection).

The exchange sits behind ``Exchange`` (send / recv of uint64 arrays to a peer), so the FL
transport can replace the socket mesh later without touching the protocol in ``consensus.Site``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import Client, Connection, Listener
from typing import Protocol

import numpy as np

from plinth.fl.admm.consensus import ADMMConfig, ADMMReport, Site, group_of, weights_from_counts
from plinth.fl.admm.kirkman import Design, kirkman_triple_system


class Exchange(Protocol):
    def send(self, peer: int, payload: np.ndarray) -> None: ...
    def recv(self, peer: int) -> np.ndarray: ...


class SocketExchange:
    """Full mesh of authenticated loopback connections; FIFO per peer."""

    def __init__(
        self, me: int, listener: Listener, addresses: list[tuple[str, int]], authkey: bytes
    ) -> None:
        self.me = me
        self.conns: dict[int, Connection] = {}
        for peer in range(me + 1, len(addresses)):
            conn = Client(addresses[peer], authkey=authkey)
            conn.send_bytes(me.to_bytes(4, "big"))
            self.conns[peer] = conn
        for _ in range(me):
            conn = listener.accept()
            self.conns[int.from_bytes(conn.recv_bytes(), "big")] = conn

    def send(self, peer: int, payload: np.ndarray) -> None:
        self.conns[peer].send_bytes(np.ascontiguousarray(payload, dtype=np.uint64).tobytes())

    def recv(self, peer: int) -> np.ndarray:
        return np.frombuffer(self.conns[peer].recv_bytes(), dtype=np.uint64).copy()

    def close(self) -> None:
        for c in self.conns.values():
            c.close()


def site_loop(site: Site, design: Design, iterations: int, ex: Exchange) -> list[np.ndarray]:
    """The per-site protocol over any Exchange; returns z after each iteration."""
    me, v = site.site_id, sum(len(t) for t in design[0])
    history = []
    for k in range(iterations):
        group = group_of(design, k, me)
        partners = [p for p in group if p != me]
        for p, r in site.shares(k, group).items():
            ex.send(p, r)
        part = site.partial([ex.recv(p) for p in partners])
        for p in partners:
            ex.send(p, part)
        group_sum = part + ex.recv(partners[0]) + ex.recv(partners[1])
        leaders = sorted(min(t) for t in design[k % len(design)])
        if me == min(group):
            for other in range(v):
                if other not in group:
                    ex.send(other, group_sum)
        sums = [group_sum] + [ex.recv(lead) for lead in leaders if lead != min(group)]
        history.append(site.finish(sums).copy())
    return history


def _site_main(me, w, pi, seed, config, design, iters, listener, addresses, authkey, out) -> None:
    try:
        site = Site(me, w, pi, np.random.default_rng(seed), config)
        ex = SocketExchange(me, listener, addresses, authkey)
        history = site_loop(site, design, iters, ex)
        out.send((me, os.getpid(), True, np.stack(history)))
        ex.close()
    except Exception as exc:  # noqa: BLE001 - any failure is reported so the parent never hangs
        out.send((me, os.getpid(), False, f"{type(exc).__name__}: {exc}"))
    finally:
        out.close()


def run_admm_processes(
    models: np.ndarray,
    num_examples: list[int],
    *,
    config: ADMMConfig | None = None,
    seed: int = 0,
    timeout: float = 60.0,
) -> tuple[ADMMReport, set[int]]:
    """Run one process per site on loopback; return the report and the sites' process ids."""
    config = config or ADMMConfig()
    w = np.asarray(models, dtype=np.float64)
    v = w.shape[0]
    pi = weights_from_counts(num_examples)
    design = kirkman_triple_system(v)
    iters = config.num_iterations(v)
    ctx = mp.get_context("fork")  # listeners are created here and inherited by the children
    authkey = os.urandom(32)
    listeners = [Listener(("127.0.0.1", 0), authkey=authkey) for _ in range(v)]
    addresses = [lst.address for lst in listeners]
    seeds = np.random.SeedSequence(seed).spawn(v)
    pipes, procs = [], []
    for i in range(v):
        recv_end, send_end = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_site_main,
            args=(
                i,
                w[i],
                float(pi[i]),
                seeds[i],
                config,
                design,
                iters,
                listeners[i],
                addresses,
                authkey,
                send_end,
            ),
            daemon=True,
        )
        p.start()
        send_end.close()
        pipes.append(recv_end)
        procs.append(p)
    results, pids = {}, set()
    try:
        for conn in pipes:
            if not conn.poll(timeout):
                raise TimeoutError(f"a site did not finish within {timeout}s")
            me, pid, ok, hist = conn.recv()
            if not ok:
                raise RuntimeError(f"site {me} failed: {hist}")
            results[me], pids = hist, pids | {pid}
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        for lst in listeners:
            lst.close()
    exact = pi @ w
    finals = [results[i][-1] for i in range(v)]
    if any(not np.array_equal(finals[0], f) for f in finals[1:]):
        raise RuntimeError("sites disagree on z")
    scale = max(float(np.max(np.abs(exact))), 1e-12)
    errors = [float(np.max(np.abs(results[0][k] - exact)) / scale) for k in range(iters)]
    return ADMMReport(finals[0], exact, errors, iters), pids
