"""Gavel's data between passes (`plinth.sched.policies.gavel`): the per-job bookkeeping, one row
of numpy arrays per job in the active set, and the (job x GPU model) throughput matrix."""

from __future__ import annotations

import numpy as np

from plinth.core.resources import Allocation, Cluster
from plinth.core.throughput import DEFAULT_THROUGHPUTS, Throughputs
from plinth.sched.types import JobState


class GavelBook:
    """Per-job bookkeeping as numpy arrays, one row per job in the active set; rows are reused
    once their job leaves. Static per row: the job's class (-1: needs no GPU), submit time
    and id (for "older first" ties). Dynamic: X, time active, time received per model."""

    def __init__(self, models: int) -> None:
        self.models = models
        self.row: dict[int, int] = {}
        self.free: list[int] = []
        self.size = 0
        self._grow(256)

    def _grow(self, n: int) -> None:
        m, old = self.models, self.size
        for name, shape, dtype, fill in (
                ("X", (n, m), float, 0.0), ("has_x", (n,), bool, False),
                ("recv", (n, m), float, 0.0), ("active", (n,), float, 0.0),
                ("cls", (n,), np.intp, -1), ("submit", (n,), float, 0.0),
                ("jid", (n,), np.int64, -1), ("run_m", (n,), np.intp, -1),
                ("why_key", (n, 2 * m), np.int64, -1)):
            a = np.full(shape, fill, dtype=dtype)
            if old:
                a[:old] = getattr(self, name)
            setattr(self, name, a)
        self.why: list[str | None] = (self.why if old else []) + [None] * (n - old)
        self.free.extend(range(n - 1, old - 1, -1))
        self.size = n

    def add(self, js: JobState, cls: int) -> int:
        if not self.free:
            self._grow(2 * self.size)
        r = self.free.pop()
        self.row[js.id] = r
        self.X[r] = 0.0
        self.recv[r] = 0.0
        self.why_key[r] = -1
        self.has_x[r], self.active[r], self.cls[r] = False, 0.0, cls
        self.submit[r], self.jid[r], self.run_m[r], self.why[r] = (
            js.job.submit_time, js.id, -1, None)
        return r

    def drop(self, jid: int) -> None:
        r = self.row.pop(jid)
        self.jid[r], self.run_m[r], self.why[r] = -1, -1, None
        self.free.append(r)


def throughput_matrix(jobs: list[JobState], models: tuple[str, ...],
                      throughputs: Throughputs = DEFAULT_THROUGHPUTS) -> np.ndarray:
    """T[j, m] = speed of job j's type on one GPU of model m, looked up once per type."""
    if not jobs:
        return np.zeros((0, len(models)))
    return np.stack([throughputs.speeds(throughputs.type_of(js.job), models) for js in jobs])


def model_index(cluster: Cluster, alloc: Allocation | None) -> int:
    """Index into cluster.models of the GPUs an allocation holds; -1 for none."""
    if alloc is None or not alloc.slots or not alloc.slots[0].gpus:
        return -1
    return cluster.node_model_list[alloc.slots[0].node]
