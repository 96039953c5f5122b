"""Run ADMM sites as separate processes that talk over the FL transport (gRPC on 127.0.0.1);
the processes are started by `plinth.runtime.pool`.

Each site is a process with its own `PeerExchange` (a gRPC server on a free loopback port plus a
channel to every peer). The launcher learns each site's port, hands every site the full address
list, and hands out one random token per site (each site checks its peers' tokens). The protocol
in ``consensus.Site`` only sees ``Exchange``: send / recv of arrays to a peer.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe, wait
from typing import Any, Protocol

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl.admm.consensus import ADMMConfig, ADMMReport, Site, group_of, weights_from_counts
from plinth.fl.admm.kirkman import Design, kirkman_triple_system
from plinth.fl.transport.peer import PeerExchange
from plinth.runtime.pool import spawn

# What a site imports, loaded once by the fork server (a missing one is skipped).
PRELOAD = [__name__, "plinth.fl.admm.task", "torch", "plinth.fl.client", "plinth.fl.torch_client",
           "sklearn.datasets"]


class Exchange(Protocol):
    def send(self, peer: int, payload: np.ndarray) -> None: ...
    def recv(self, peer: int) -> np.ndarray: ...


def site_loop(site: Site, design: Design, iterations: int, ex: Exchange) -> list[np.ndarray]:
    """The per-site protocol over any Exchange; returns z after each iteration."""
    me, v = site.site_id, sum(len(t) for t in design[0])
    others = [p for p in range(v) if p != me]
    for p in others:  # phase 0: the pair keys of the masks
        ex.send(p, site.public_key())
    site.agree({p: ex.recv(p) for p in others})
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


@dataclass(frozen=True, slots=True)
class PeerSecurity:
    """What a site needs to authenticate its peers: token → site id, its own token, and TLS
    material (PEM bytes; cert and key for its server, ca to pin when dialling)."""

    tokens: dict[str, str] | None = None
    token: str | None = None
    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None


def random_tokens(v: int) -> dict[str, str]:
    return {secrets.token_hex(16): str(i) for i in range(v)}


def token_of(tokens: dict[str, str] | None, me: int) -> str | None:
    if tokens is None:
        return None
    return next((t for t, cid in tokens.items() if cid == str(me)), None)


Job = Callable[..., Any]  # job(exchange, report, *args) -> result; report(obj) goes to the parent


def _site_process(me: int, v: int, sec: PeerSecurity, chunk_size: int, timeout: float,
                  audit: bool, job: Job, args: tuple, conn: Connection) -> None:
    ex = None
    try:
        ex = PeerExchange(me, v, tokens=sec.tokens, token=sec.token, cert=sec.cert, key=sec.key,
                          ca=sec.ca, chunk_size=chunk_size, timeout=timeout, audit=audit)
        conn.send(("port", ex.port))
        ex.connect(conn.recv())
        result = job(ex, lambda obj: conn.send(("report", obj)), *args)
        conn.send(("done", (os.getpid(), result, ex.audit_log, ex.rejected)))
    except Exception as exc:  # noqa: BLE001 - any failure is reported so the parent never hangs
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()
        if ex is not None:
            ex.close()


@dataclass(slots=True)
class SiteResult:
    pid: int
    result: Any
    audit_log: list[tuple[int, int, np.ndarray]] | None
    rejected: list[str]


def run_sites(v: int, job: Job, args: list[tuple], *, security: PeerSecurity | None = None,
              chunk_size: int = 1 << 20, timeout: float = 120.0, audit: bool = False,
              on_report: Callable[[int, Any], None] | None = None) -> list[SiteResult]:
    """Start v site processes on 127.0.0.1, connect them into a mesh, run ``job(ex, report,
    *args[i])`` in site i; return each site's result. ``on_report(site, obj)`` gets what sites
    report on the way (in arrival order). One random token per site unless `security` says.

    Sites fork from a fork server (`plinth.runtime.pool.spawn`; never from this process, which
    may hold gRPC or torch threads) that imports `PRELOAD` once, so that each site need not."""
    if security is None:
        tokens = random_tokens(v)
        secs = [PeerSecurity(tokens, token_of(tokens, i)) for i in range(v)]
    else:
        secs = [PeerSecurity(security.tokens, security.token or token_of(security.tokens, i),
                             security.cert, security.key, security.ca) for i in range(v)]
    pipes: list[Connection] = []
    procs = []
    for i in range(v):
        parent_end, child_end = Pipe()
        p = spawn(_site_process, i, v, secs[i], chunk_size, timeout, audit, job, args[i],
                  child_end, method="forkserver", preload=PRELOAD)
        child_end.close()
        pipes.append(parent_end)
        procs.append(p)
    which = {id(c): i for i, c in enumerate(pipes)}
    results: dict[int, SiteResult] = {}
    ports: dict[int, int] = {}
    start_limit = timeout + 60.0  # a spawned site imports its modules first
    try:
        open_pipes = list(pipes)
        while open_pipes:
            ready = wait(open_pipes, timeout=start_limit if len(ports) < v else timeout * 2)
            if not ready:
                missing = sorted(set(range(v)) - set(results))
                raise PlinthError(f"ADMM sites {missing} sent nothing for "
                                  f"{start_limit if len(ports) < v else timeout * 2:g}s")
            for c in ready:
                i = which[id(c)]
                try:
                    kind, obj = c.recv()
                except EOFError:
                    raise PlinthError(f"ADMM site {i} exited without a result "
                                      f"(exit code {procs[i].exitcode})") from None
                if kind == "port":
                    ports[i] = obj
                    if len(ports) == v:
                        addresses = [f"127.0.0.1:{ports[j]}" for j in range(v)]
                        for q in pipes:
                            q.send(addresses)
                elif kind == "report":
                    if on_report is not None:
                        on_report(i, obj)
                elif kind == "error":
                    raise PlinthError(f"ADMM site {i} failed: {obj}")
                else:
                    results[i] = SiteResult(*obj)
                    open_pipes.remove(c)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for c in pipes:
            c.close()
    return [results[i] for i in range(v)]


def _admm_job(ex: PeerExchange, report: Callable[[Any], None], w: np.ndarray, pi: float,
              config: ADMMConfig, design: Design, iters: int, trace: bool
              ) -> tuple[np.ndarray, list[np.ndarray]]:
    site = Site(ex.me, w, pi, config, trace=trace)  # its randomness: a CSPRNG of its own
    history = site_loop(site, design, iters, ex)
    return np.stack(history), site.sent_values


def run_admm_processes(
    models: np.ndarray,
    num_examples: list[int],
    *,
    config: ADMMConfig | None = None,
    timeout: float = 60.0,
    audit: bool = False,
    security: PeerSecurity | None = None,
) -> tuple[ADMMReport, list[SiteResult]]:
    """One process per site, talking gRPC on loopback, each drawing its secret randomness from
    its own CSPRNG (so runs are not bit-for-bit repeatable); the report and each site's result (its
    process id, z after each iteration, and with `audit` its encoded pi_i y_i per iteration and
    every message it received, as (sender, seq, array))."""
    config = config or ADMMConfig()
    w = np.asarray(models, dtype=np.float64)
    v = w.shape[0]
    pi = weights_from_counts(num_examples)
    design = kirkman_triple_system(v)
    iters = config.num_iterations(v)
    args = [(w[i], float(pi[i]), config, design, iters, audit) for i in range(v)]
    sites = run_sites(v, _admm_job, args, timeout=timeout, audit=audit, security=security)
    exact = pi @ w
    finals = [s.result[0][-1] for s in sites]
    if any(not np.array_equal(finals[0], f) for f in finals[1:]):
        raise PlinthError("ADMM sites disagree on z")
    scale = max(float(np.max(np.abs(exact))), 1e-12)
    errors = [float(np.max(np.abs(sites[0].result[0][k] - exact)) / scale) for k in range(iters)]
    return ADMMReport(finals[0], exact, errors, iters), sites
