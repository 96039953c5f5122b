"""A LIFL-style aggregator tree on one machine: leaves → middle → top, via shared memory.

After Qi et al., "LIFL" (MLSys'24). An update is written once into a
`multiprocessing.shared_memory` block (where a receiver would land it off the network); from then
on only a small reference (block name, size, weight) moves. Each leaf aggregator process maps the
block, decodes zero-copy views with `serde`, folds them eagerly into its own running sum (the
streaming engine) and frees the block. On `finish`, each leaf hands its partial sum up the tree in
a new block; the middle aggregator (one per machine) folds those, and only its single aggregated
update goes to the top.

    tree = Hierarchy(template, leaves=4)
    for payload, weight in arrivals:
        tree.submit(payload, weight)       # payload: an encoded FitRes (dense update)
    result = tree.finish()                 # sums, total weight, count, rejections
    tree.close()
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl import serde
from plinth.fl.messages import FitRes, NDArrays


@dataclass(slots=True)
class Ref:
    """A handle on an update in shared memory: all that crosses between aggregators."""

    name: str
    size: int
    weight: float
    count: int = 1
    tag: str = ""
    slot: int = -1  # a reusable slot of the tree's pool, or -1 for a one-off block


@dataclass(slots=True)
class TreeResult:
    sums: NDArrays
    total_weight: float
    count: int
    rejected: list[tuple[str, str]] = field(default_factory=list)

    def mean(self) -> NDArrays | None:
        if self.count == 0:
            return None
        return [s / self.total_weight for s in self.sums]


def put(buf: bytes | bytearray | memoryview) -> shared_memory.SharedMemory:
    """Copy `buf` into a new shared-memory block (the one copy: off the wire into shm)."""
    mv = memoryview(buf)
    shm = shared_memory.SharedMemory(create=True, size=max(1, mv.nbytes))
    shm.buf[: mv.nbytes] = mv
    return shm


def _attach(name: str) -> shared_memory.SharedMemory:
    """Map an existing block. Every block is unlinked by the process that consumes it; the
    resource tracker (shared by the tree's processes) keeps a set, so this stays balanced."""
    return shared_memory.SharedMemory(name=name)


def _fold_block(agg: Any, buf: memoryview, ref: Ref, leaf: bool) -> str | None:
    """Fold the update in `buf`; returns why it was rejected, or None. Every view into `buf`
    dies with this frame, so the block can be closed afterwards."""
    from plinth.fl.aggregate.engine import UpdateRejected

    try:
        if ref.count == 1 and leaf:
            res = serde.decode(buf[: ref.size], expect=FitRes)
            agg.add(res.update, ref.weight)
        else:  # a partial sum from below
            agg.add_sum(serde.arrays_from_bytes(buf[: ref.size]), ref.weight, ref.count)
    except (UpdateRejected, serde.SerdeError) as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a bad update must not kill the aggregator
        return f"{type(e).__name__}: {e}"
    return None


def _node(role: str, template: list[tuple[tuple[int, ...], str]], inbox: Any, outbox: Any,
          threads: int, free: Any = None) -> None:
    """One aggregator process: fold refs from `inbox` until "finish", then send a partial up."""
    from plinth.fl.aggregate.engine import StreamingAggregator

    tmpl = [(tuple(s), np.dtype(d)) for s, d in template]
    agg = StreamingAggregator(tmpl, threads=threads)
    rejected: list[tuple[str, str]] = []
    mapped: dict[str, shared_memory.SharedMemory] = {}
    while True:
        msg = inbox.get()
        if msg == "stop":
            break
        if msg == "finish":
            sums = serde.arrays_to_bytes(agg.sums())
            shm = put(sums)
            shm.close()
            outbox.put((Ref(shm.name, len(sums), agg.total_weight, agg.count, role), rejected))
            agg.reset()
            rejected = []
            continue
        ref: Ref = msg
        if ref.slot >= 0:  # a pool slot: map it once, keep it mapped, hand it back when folded
            shm = mapped.get(ref.name) or mapped.setdefault(ref.name, _attach(ref.name))
            why = _fold_block(agg, shm.buf, ref, role.startswith("leaf"))
            free.put(ref.slot)
        else:
            shm = _attach(ref.name)
            try:
                why = _fold_block(agg, shm.buf, ref, role.startswith("leaf"))
            finally:
                shm.close()
                shm.unlink()
        if why is not None:
            rejected.append((ref.tag, why))
    for shm in mapped.values():
        shm.close()
    agg.close()


def _copy_out(buf: memoryview, size: int) -> NDArrays:
    return [np.array(a, copy=True) for a in serde.arrays_from_bytes(buf[:size])]


class Hierarchy:
    """`leaves` leaf aggregators feeding one middle aggregator, whose sum is the machine's."""

    def __init__(self, template: NDArrays | list, *, leaves: int = 4, threads: int = 1,
                 slots: int | None = None) -> None:
        if leaves < 1:
            raise PlinthError(f"hierarchy: leaves must be >= 1 (got {leaves})")
        ctx = mp.get_context("spawn")
        self.template = [(list(t.shape), np.dtype(t.dtype).str) if hasattr(t, "shape")
                         else (list(t[0]), np.dtype(t[1]).str) for t in template]
        self._up: Any = ctx.Queue()  # leaves → middle
        self._top: Any = ctx.Queue()  # middle → here
        self._mid_in: Any = ctx.Queue()
        self._leaf_in = [ctx.Queue() for _ in range(leaves)]
        # As in LIFL, updates land in a pool of reusable shared-memory slots: no block is created
        # or page-faulted per update once the pool is warm. Leaves return a slot when folded.
        self._free: Any = ctx.Queue()
        self._slots: list[shared_memory.SharedMemory] = []
        self._nslots = slots if slots is not None else 2 * leaves + 2
        self._procs = [ctx.Process(target=_node, args=(f"leaf{i}", self.template, q, self._up,
                                                       threads, self._free), daemon=True)
                       for i, q in enumerate(self._leaf_in)]
        self._procs.append(ctx.Process(target=_node, args=("middle", self.template, self._mid_in,
                                                           self._top, threads), daemon=True))
        for p in self._procs:
            p.start()
        self._next = 0
        self._loads = [0] * leaves

    def submit(self, payload: bytes | bytearray | memoryview, weight: float,
               tag: str = "") -> None:
        """Land one encoded FitRes in shared memory and hand its reference to a leaf."""
        size = memoryview(payload).nbytes
        if not self._slots and self._nslots > 0:
            # size the pool from the first update (updates of one model are all alike)
            self._slots = [shared_memory.SharedMemory(create=True, size=max(1, size))
                           for _ in range(self._nslots)]
            for i in range(self._nslots):
                self._free.put(i)
        if self._slots and size <= self._slots[0].size:
            slot = self._free.get()  # blocks while every slot is being folded: backpressure
            self._slots[slot].buf[:size] = memoryview(payload)
            ref = Ref(self._slots[slot].name, size, float(weight), 1, tag, slot)
        else:
            shm = put(payload)
            ref = Ref(shm.name, size, float(weight), 1, tag)
            shm.close()  # the leaf unlinks it once folded
        leaf = min(range(len(self._loads)), key=lambda i: (self._loads[i], i))
        self._loads[leaf] += 1
        self._leaf_in[leaf].put(ref)

    def finish(self, timeout: float = 600.0) -> TreeResult:
        """Flush leaves into the middle, the middle to here; returns the machine's sum."""
        rejected: list[tuple[str, str]] = []
        for q in self._leaf_in:
            q.put("finish")
        for _ in self._leaf_in:
            ref, rej = self._get(self._up, timeout)
            rejected += rej
            if ref.count:
                self._mid_in.put(ref)
            else:
                shm = _attach(ref.name)
                shm.close()
                shm.unlink()
        self._mid_in.put("finish")
        ref, rej = self._get(self._top, timeout)
        rejected += rej
        shm = _attach(ref.name)
        try:
            sums = _copy_out(shm.buf, ref.size)
        finally:
            shm.close()
            shm.unlink()
        self._loads = [0] * len(self._loads)
        return TreeResult(sums, ref.weight, ref.count, rejected)

    def _get(self, q: Any, timeout: float) -> Any:
        try:
            return q.get(timeout=timeout)
        except queue.Empty:
            raise PlinthError(f"hierarchy: no partial sum within {timeout:g}s") from None

    def close(self) -> None:
        for q in [*self._leaf_in, self._mid_in]:
            q.put("stop")
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
        for shm in self._slots:
            shm.close()
            shm.unlink()
        self._slots = []
