"""A LIFL-style, elastic aggregator tree on one machine: leaf processes → this process, via shm.

After Qi et al., "LIFL" (MLSys'24). An update is written once into a slot of a pool of reusable
`multiprocessing.shared_memory` blocks (where a receiver would land it off the network); from then
on only a small `Ref` (slot, size, weight) moves. Each leaf aggregator process maps the slot,
takes zero-copy views, folds them eagerly into its own running sum (the streaming engine) and
hands the slot back. On `finish`, each leaf writes its partial sum into its own block and the
process that owns the tree (the machine's middle aggregator) folds those partials: one sum per
machine goes up.

The leaves persist across rounds and `scale` sets how many are active before a round: new leaf
processes are started when the load rises, idle ones are retired when it falls. Each leaf talks
to this process over its own pipe (no lock shared between leaves), so a leaf that dies breaks
nothing else: its slots are reclaimed, a fresh leaf takes its place, and the updates it had been
given this round (folded into a partial sum that is now gone) come back as rejections.

    tree = Hierarchy(template, leaves=4)
    for payload, weight in arrivals:
        tree.submit(payload, weight)       # payload: an encoded FitRes (dense update)
    result = tree.finish()                 # sums, total weight, count, rejections
    tree.close()
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing import connection, shared_memory
from typing import Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl import serde
from plinth.fl.messages import FitRes, NDArrays

log = logging.getLogger("plinth.fl.aggregate")

_ALIGN = 64


@dataclass(slots=True)
class Ref:
    """A handle on an update in shared memory: all that crosses between aggregators."""

    name: str
    size: int
    weight: float
    count: int = 1
    tag: str = ""
    slot: int = -1  # a reusable slot of the tree's pool, or -1 for a one-off block
    raw: bool = False  # arrays back to back in the template's layout, not an encoded FitRes


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


Layout = list[tuple[int, tuple[int, ...], str]]  # (offset, shape, dtype) per array


def layout(template: list[tuple[Any, Any]]) -> tuple[Layout, int]:
    """Offsets of the template's arrays packed back to back (64-byte aligned), and the total."""
    out, off = [], 0
    for shape, dtype in template:
        dt = np.dtype(dtype)
        out.append((off, tuple(shape), dt.str))
        off += -(-math.prod(shape) * dt.itemsize // _ALIGN) * _ALIGN
    return out, off


def views(buf: memoryview, lay: Layout) -> NDArrays:
    """Zero-copy arrays over `buf` in layout `lay`."""
    return [np.frombuffer(buf, dtype=dt, count=math.prod(shape), offset=off).reshape(shape)
            for off, shape, dt in lay]


def put(buf: bytes | bytearray | memoryview) -> shared_memory.SharedMemory:
    """Copy `buf` into a new shared-memory block (the one copy: off the wire into shm)."""
    mv = memoryview(buf)
    shm = shared_memory.SharedMemory(create=True, size=max(1, mv.nbytes))
    shm.buf[: mv.nbytes] = mv
    return shm


def _unlink(name: str) -> None:
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    shm.close()
    shm.unlink()


def _fold_block(agg: Any, buf: memoryview, ref: Ref, lay: Layout) -> str | None:
    """Fold the update in `buf`; returns why it was rejected, or None. Every view into `buf`
    dies with this frame, so the block can be closed afterwards."""
    from plinth.fl.aggregate.engine import UpdateRejected

    try:
        if ref.raw:
            agg.add(views(buf, lay), ref.weight)
        else:
            agg.add(serde.decode(buf[: ref.size], expect=FitRes).update, ref.weight)
    except (UpdateRejected, serde.SerdeError) as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a bad update must not kill the aggregator
        return f"{type(e).__name__}: {e}"
    return None


def _copy_into(dst: NDArrays, src: NDArrays) -> None:
    for d, x in zip(dst, src):
        np.copyto(d, x, casting="no")


def _leaf(conn: Any, template: list[tuple[list[int], str]], partial: str, threads: int,
          core: int | None) -> None:
    """One leaf aggregator process: fold refs until "finish", then write the partial sum into
    its block and report it; slots are handed back as soon as they are folded."""
    from plinth.fl.aggregate.engine import StreamingAggregator, acc_dtype

    if core is not None and hasattr(os, "sched_setaffinity"):
        try:  # locality: this leaf's folds stay on one core (and its cache)
            os.sched_setaffinity(0, {core})
        except OSError:
            pass
    tmpl = [(tuple(s), np.dtype(d)) for s, d in template]
    lay = layout(tmpl)[0]
    agg = StreamingAggregator(tmpl, threads=threads)
    out = shared_memory.SharedMemory(name=partial)
    out_views = views(out.buf, layout([(s, acc_dtype(d)) for s, d in tmpl])[0])
    rejected: list[tuple[str, str]] = []
    mapped: dict[str, shared_memory.SharedMemory] = {}
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the tree's owner is gone
                break
            if isinstance(msg, Ref):
                if msg.slot >= 0:  # a pool slot: map it once, keep it mapped
                    shm = mapped.get(msg.name)
                    if shm is None:
                        shm = mapped[msg.name] = shared_memory.SharedMemory(name=msg.name)
                    why = _fold_block(agg, shm.buf, msg, lay)
                else:  # a one-off block: this leaf unlinks it
                    shm = shared_memory.SharedMemory(name=msg.name)
                    try:
                        why = _fold_block(agg, shm.buf, msg, lay)
                    finally:
                        shm.close()
                        shm.unlink()
                conn.send(("free", msg.slot))
                if why is not None:
                    rejected.append((msg.tag, why))
            elif msg[0] == "finish":
                _copy_into(out_views, agg.sums())
                conn.send(("partial", agg.total_weight, agg.count, rejected))
                agg.reset()
                rejected = []
            elif msg[0] == "drop":  # slots the pool no longer has
                for name in msg[1]:
                    shm = mapped.pop(name, None)
                    if shm is not None:
                        shm.close()
            elif msg[0] == "stop":
                break
    finally:
        del out_views
        for shm in mapped.values():
            shm.close()
        out.close()
        agg.close()


class _Leaf:
    """This process's side of one leaf: its process, pipe, partial-sum block and round state."""

    def __init__(self, ctx: Any, template: list, partial_bytes: int, threads: int,
                 core: int | None) -> None:
        self.partial = shared_memory.SharedMemory(create=True, size=max(1, partial_bytes))
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_leaf, args=(child, template, self.partial.name, threads,
                                                    core), daemon=True)
        self.proc.start()
        child.close()  # so that the leaf sees EOF if this process dies
        self.held: set[int] = set()  # pool slots it has not handed back
        self.oneoffs: set[str] = set()  # one-off blocks not yet folded (it unlinks them)
        self.tags: list[str] = []  # updates given to it this round

    def release(self, wait: float) -> None:
        """Stop (politely, then by force), and free its partial block."""
        try:
            self.conn.send(("stop",))
        except OSError:
            pass
        self.proc.join(wait)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        self.conn.close()
        self.partial.close()
        try:
            self.partial.unlink()
        except FileNotFoundError:
            pass
        for name in self.oneoffs:
            _unlink(name)
        self.oneoffs.clear()


def _shutdown(leaves: list[_Leaf], slots: list[shared_memory.SharedMemory]) -> None:
    for leaf in leaves:
        leaf.release(10)
    leaves.clear()
    for shm in slots:
        shm.close()
        shm.unlink()
    slots.clear()


class Hierarchy:
    """`leaves` leaf aggregator processes feeding this process, which folds their partial sums.

    `slots` fixes the size of the shared-memory pool (default: two per active leaf plus two);
    `pin` pins leaf i to the i-th CPU this process may use, where the OS allows it. A leaf that
    hands back no slot, or no partial sum, for `stall_timeout` seconds is stuck (alive but not
    folding): it is killed and replaced like a leaf that died.
    """

    def __init__(self, template: NDArrays | list, *, leaves: int = 4, threads: int = 1,
                 slots: int | None = None, pin: bool = True, stall_timeout: float = 60.0
                 ) -> None:
        self._ctx = mp.get_context("spawn")
        self.template = [(list(t.shape), np.dtype(t.dtype).str) if hasattr(t, "shape")
                         else (list(t[0]), np.dtype(t[1]).str) for t in template]
        from plinth.fl.aggregate.engine import acc_dtype

        self._layout, self._raw_bytes = layout(self.template)
        self._partial_layout, self._partial_bytes = layout(
            [(s, acc_dtype(np.dtype(d))) for s, d in self.template])
        self.threads, self._fixed_slots, self.pin = threads, slots, pin
        self.stall_timeout = stall_timeout
        self._cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else list(range(os.cpu_count() or 1))
        self._leaves: list[_Leaf] = []
        self._slots: list[shared_memory.SharedMemory] = []
        self._free: list[int] = []
        self._slot_bytes = 0
        self._lost: list[tuple[str, str]] = []  # updates lost with a dead leaf, this round
        self._in_round = False
        self.replaced = 0  # leaves that died and were replaced
        self._finalizer = weakref.finalize(self, _shutdown, self._leaves, self._slots)
        self.scale(leaves)

    # -- elasticity -----------------------------------------------------------------------------

    @property
    def leaves(self) -> int:
        return len(self._leaves)

    @property
    def in_round(self) -> bool:
        """Whether updates were handed out since the last `finish`."""
        return self._in_round

    @property
    def pids(self) -> list[int]:
        return [leaf.proc.pid for leaf in self._leaves]

    def blocks(self) -> list[str]:
        """Names of the shared-memory blocks the tree holds now (slots, partial sums)."""
        return [s.name for s in self._slots] + [leaf.partial.name for leaf in self._leaves]

    def _core(self, i: int) -> int | None:
        return self._cores[i % len(self._cores)] if self.pin else None

    def _spawn(self, i: int) -> _Leaf:
        return _Leaf(self._ctx, self.template, self._partial_bytes, self.threads, self._core(i))

    def scale(self, leaves: int) -> int:
        """Set the number of active leaves (between rounds): start new leaf processes or retire
        the newest ones; the slot pool follows. Returns the number of leaves."""
        if leaves < 1:
            raise PlinthError(f"hierarchy: leaves must be >= 1 (got {leaves})")
        if self._in_round:
            raise PlinthError("hierarchy: scale() between rounds only (finish() first)")
        while len(self._leaves) < leaves:
            self._leaves.append(self._spawn(len(self._leaves)))
        while len(self._leaves) > leaves:
            self._leaves.pop().release(10)
        want = self._fixed_slots if self._fixed_slots is not None else 2 * leaves + 2
        if self._slots and len(self._slots) > want:  # every slot is free between rounds
            drop = self._slots[want:]
            del self._slots[want:]
            for leaf in self._leaves:
                self._send(leaf, ("drop", [s.name for s in drop]))
            for shm in drop:
                shm.close()
                shm.unlink()
            self._free = [i for i in self._free if i < want]
        elif self._slots and len(self._slots) < want:
            self._grow(want)
        return len(self._leaves)

    def _grow(self, want: int) -> None:
        while len(self._slots) < want:
            self._free.append(len(self._slots))
            self._slots.append(shared_memory.SharedMemory(create=True, size=self._slot_bytes))

    # -- a round --------------------------------------------------------------------------------

    def submit(self, payload: bytes | bytearray | memoryview, weight: float,
               tag: str = "") -> None:
        """Land one encoded FitRes in shared memory and hand its reference to a leaf."""
        mv = memoryview(payload).cast("B")
        self._land(mv.nbytes, lambda buf: buf.__setitem__(slice(0, mv.nbytes), mv),
                   float(weight), tag, raw=False)

    def submit_arrays(self, arrays: NDArrays, weight: float, tag: str = "") -> None:
        """Land one update (arrays already checked against the template's shapes and dtypes)
        straight into a slot, in the template's layout: the one copy, no encoding."""
        def write(buf: memoryview) -> None:
            _copy_into(views(buf, self._layout), arrays)
        self._land(self._raw_bytes, write, float(weight), tag, raw=True)

    def _land(self, size: int, write: Any, weight: float, tag: str, raw: bool) -> None:
        self._in_round = True
        if not self._slots:
            # size the pool from the first update (updates of one model are all alike)
            self._slot_bytes = max(1, size, self._raw_bytes)
            self._grow(self._fixed_slots if self._fixed_slots is not None
                       else 2 * len(self._leaves) + 2)
        while True:
            leaf = min(self._leaves, key=lambda x: (len(x.held) + len(x.oneoffs), len(x.tags)))
            if size <= self._slot_bytes and self._slots:
                slot = self._take_slot()
                shm = self._slots[slot]
                write(shm.buf)
                ref = Ref(shm.name, size, weight, 1, tag, slot, raw)
            else:
                slot = -1
                shm = shared_memory.SharedMemory(create=True, size=max(1, size))
                write(shm.buf)
                ref = Ref(shm.name, size, weight, 1, tag, -1, raw)
                shm.close()
            if leaf not in self._leaves:  # it died while we waited for a slot
                self._undo_land(ref)
                continue
            if self._send(leaf, ref):
                (leaf.held.add(slot) if slot >= 0 else leaf.oneoffs.add(ref.name))
                leaf.tags.append(tag)
                return
            self._undo_land(ref)  # it died: land again for another leaf

    def _undo_land(self, ref: Ref) -> None:
        if ref.slot >= 0:
            self._free.append(ref.slot)
        else:
            _unlink(ref.name)

    def _take_slot(self) -> int:
        """A free slot; blocks while every slot is being folded (backpressure). If none comes
        back within `stall_timeout`, the leaves holding slots are stuck and are replaced."""
        deadline = time.monotonic() + self.stall_timeout
        while not self._free:
            left = deadline - time.monotonic()
            if left <= 0:
                for leaf in [x for x in self._leaves if x.held]:
                    self._stuck(leaf)
                deadline = time.monotonic() + self.stall_timeout
                continue
            self._poll(timeout=left)
        return self._free.pop()

    def _stuck(self, leaf: _Leaf) -> None:
        leaf.proc.kill()
        leaf.proc.join(5)
        self._died(leaf, f"stopped folding for {self.stall_timeout:g}s and was killed")

    def _send(self, leaf: _Leaf, msg: Any) -> bool:
        try:
            leaf.conn.send(msg)
            return True
        except OSError:
            self._died(leaf)
            return False

    def _poll(self, timeout: float | None) -> list[tuple[_Leaf, Any]]:
        """Read what the leaves have sent (freed slots are taken here); returns the other
        messages. A leaf found dead is replaced."""
        conns = {leaf.conn: leaf for leaf in self._leaves}
        sentinels = {leaf.proc.sentinel: leaf for leaf in self._leaves}
        out = []
        for ready in connection.wait([*conns, *sentinels], timeout):
            leaf = conns.get(ready) or sentinels[ready]
            if leaf not in self._leaves:
                continue
            try:
                while leaf.conn.poll():
                    msg = leaf.conn.recv()
                    if msg[0] == "free":
                        if msg[1] >= 0:
                            leaf.held.discard(msg[1])
                            self._free.append(msg[1])
                    else:
                        out.append((leaf, msg))
                if ready is leaf.proc.sentinel:
                    raise EOFError
            except (EOFError, OSError):
                self._died(leaf)
        return out

    def _died(self, leaf: _Leaf, how: str = "") -> None:
        """Replace a dead (or stuck) leaf: its slots come back, its round's updates are lost."""
        if leaf not in self._leaves:
            return
        i = self._leaves.index(leaf)
        how = how or f"died (exit code {leaf.proc.exitcode})"
        log.warning("aggregator leaf %d (pid %s) %s; %d updates of this round lost; starting a "
                    "new one", i, leaf.proc.pid, how, len(leaf.tags))
        why = f"lost: aggregator leaf {i} {how} before its partial sum was taken"
        self._lost += [(t, why) for t in leaf.tags]
        self._free += sorted(leaf.held)
        leaf.held.clear()
        leaf.release(0)
        self._leaves[i] = self._spawn(i)
        self.replaced += 1

    def finish(self, timeout: float | None = None, into: Any = None) -> TreeResult:
        """End the round: every leaf writes its partial sum, which this process folds (into
        `into`, a `StreamingAggregator`, or a fresh one); returns the sum, total weight and
        count, and the rejections, lost updates included. A leaf whose partial sum does not
        come within `timeout` (default `stall_timeout`) is stuck: replaced, its updates lost."""
        from plinth.fl.aggregate.engine import StreamingAggregator

        agg = into if into is not None else StreamingAggregator(
            [(tuple(s), np.dtype(d)) for s, d in self.template])
        rejected: list[tuple[str, str]] = []
        waiting = [leaf for leaf in self._leaves if self._send(leaf, ("finish",))]
        waiting = [leaf for leaf in waiting if leaf in self._leaves]
        deadline = time.monotonic() + (self.stall_timeout if timeout is None else timeout)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                for leaf in waiting:
                    self._stuck(leaf)
                break
            for leaf, msg in self._poll(left):
                if msg[0] != "partial" or leaf not in waiting:
                    continue
                waiting.remove(leaf)
                _, weight, count, rej = msg
                rejected += rej
                if count:
                    agg.add_sum(views(leaf.partial.buf, self._partial_layout), weight, count)
            waiting = [leaf for leaf in waiting if leaf in self._leaves]  # the dead ones: lost
        rejected += self._lost
        self._lost = []
        for leaf in self._leaves:
            leaf.tags = []
        self._in_round = False
        if into is not None:
            return TreeResult(agg.sums(), agg.total_weight, agg.count, rejected)
        try:
            return TreeResult([np.array(s, copy=True) for s in agg.sums()], agg.total_weight,
                              agg.count, rejected)
        finally:
            agg.close()

    def close(self) -> None:
        """Stop every leaf and free every shared-memory block."""
        self._finalizer()
