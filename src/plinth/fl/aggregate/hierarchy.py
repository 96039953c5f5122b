"""A LIFL-style, elastic aggregator tree on one machine: leaf processes → this process, via shm.

After Qi et al., "LIFL" (MLSys'24). An update lives in a slot of a pool of reusable
`multiprocessing.shared_memory` blocks: the network transport receives its chunks straight into
a slot (`land`: the slot is the receive buffer), or, for an update that did not arrive that way,
it is copied in once (`submit_arrays`). From then on only a small `Ref` (slot, array offsets,
weight) moves. Each leaf aggregator process maps the slot, takes zero-copy views, folds them
eagerly into its own running sum (the streaming engine) and hands the slot back. On `finish`,
each leaf writes its partial sum into its own block and the process that owns the tree (the
machine's middle aggregator) folds those partials: one sum per machine goes up.

The leaves persist across rounds and `scale` sets how many are active before a round: new leaf
processes are started when the load rises, idle ones are retired when it falls. With `listen`
the tree starts no process at all: the runtime starts leaf units, which join with the task's
token (`plinth.fl.aggregate.leaf.join`), and idle ones stay warm on standby. Each leaf talks
to this process over its own pipe (no lock shared between leaves), so a leaf that dies breaks
nothing else: its slots are reclaimed, a fresh leaf takes its place, and the updates it had been
given this round (folded into a partial sum that is now gone) come back as rejections.

    tree = Hierarchy(template, leaves=4)
    for payload, weight in arrivals:
        tree.submit(payload, weight)       # payload: an encoded FitRes (dense update)
    result = tree.finish()                 # sums, total weight, count, rejections
    tree.close()

Landing: `land(total)` (called from the transport's receiving threads) gives a free slot as a
writable buffer of `total` bytes; the transport fills it and hands it to the server, which
decodes it (the arrays are views into the slot) and checks it. `submit_arrays` then finds the
arrays inside that slot and sends the leaf their offsets: no second copy. A landed buffer that
is never submitted (a broken upload, a rejected or late update) puts its slot back in the pool
when its last view is dropped. Landed updates may hold all slots but one, so an update that must
be copied in always finds a slot once a leaf hands one back.

The pool, the leaves' pipes and the round's state are shared by the server's thread and the
transport's: every change holds `_lock`; waiting for a leaf (`_poll`) does not.

What the tree holds for each leaf (its pipe, partial-sum block and process) and the address
that runtime-started leaves join are in `leaf_link.py`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing import connection, shared_memory
from typing import Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl.aggregate.accumulator import template_of
from plinth.fl.aggregate.leaf import Ref, copy_into, layout, views
from plinth.fl.aggregate.leaf_link import (
    LeafLink,
    LeafRegistry,
    discard_slot,
    shutdown,
    unlink_block,
)
from plinth.fl.messages import NDArrays

log = logging.getLogger("plinth.fl.aggregate")

STARTUP_S = 120.0  # a leaf not ready after this long (and stall_timeout) is stuck
LANDING_HEADER = 64 << 10  # room in a slot for an encoded update's header (metrics included)


@dataclass(slots=True)
class TreeResult:
    sums: NDArrays
    total_weight: float
    count: int
    rejected: list[tuple[str, str]] = field(default_factory=list)
    # per leaf that reported: bytes it folded and seconds it spent folding (its throughput)
    folded_bytes: list[int] = field(default_factory=list)
    busy_s: list[float] = field(default_factory=list)

    def mean(self) -> NDArrays | None:
        if self.count == 0:
            return None
        return [s / self.total_weight for s in self.sums]


class Hierarchy:
    """`leaves` leaf aggregator processes feeding this process, which folds their partial sums.

    `slots` fixes the size of the shared-memory pool (default: two per active leaf plus two).
    The leaves are not pinned to cores: the runtime gives the aggregator its CPUs. A leaf that
    hands back no slot, or no partial sum, for `stall_timeout` seconds is stuck (alive but not
    folding): it is killed and replaced like a leaf that died.

    With `listen` (and the task's `token`) the tree starts no process: it uses the leaves that
    join at that address (`leaf.join`), started by the runtime. `scale` then activates up to
    that many of the joined leaves (waiting `join_timeout` only when none is active) and keeps
    the others warm on standby; a leaf that dies is replaced by a standby one if there is one.
    `listen` may be a `LeafRegistry` already listening (bound before the tree, so that its
    address is known, and kept by its owner across trees): the tree uses it and leaves it open.
    """

    def __init__(self, template: NDArrays | list, *, leaves: int = 4, threads: int = 1,
                 slots: int | None = None, stall_timeout: float = 60.0,
                 listen: str | LeafRegistry | None = None, token: bytes | None = None,
                 join_timeout: float = 60.0, keep_warm: int = 1) -> None:
        from plinth.fl.aggregate.engine import acc_dtype

        if isinstance(listen, str) and not token:
            raise PlinthError("hierarchy: external leaves need the task's token")

        self.template = template_of(template)
        self._layout, self._raw_bytes = layout(self.template)
        self._partial_layout, self._partial_bytes = layout(
            [(s, acc_dtype(d)) for s, d in self.template])
        self.threads, self._fixed_slots = threads, slots
        self.stall_timeout = stall_timeout
        self._leaves: list[LeafLink] = []
        self._slots: list[shared_memory.SharedMemory] = []
        self._base: list[int] = []  # each slot's address here, to find landed arrays in it
        self._free: list[int] = []
        # room for a whole encoded FitRes: the arrays (as laid out here) plus its header
        self._slot_bytes = self._raw_bytes + LANDING_HEADER + 256 * len(self.template)
        self._landed: dict[int, tuple[int, int]] = {}  # slot -> (landing number, bytes)
        self.landings = 0  # updates received straight into a slot, so far ...
        self.copied = 0  # ... and updates copied into one (they arrived some other way)
        self._inbox: list[tuple[LeafLink, Any]] = []  # leaves' replies read by any thread
        self._lock = threading.RLock()
        self._handed = threading.Condition(self._lock)  # a landed slot left the landings
        self._lost: list[tuple[str, str]] = []  # updates lost with a dead leaf, this round
        self._in_round = False
        self.replaced = 0  # leaves that died (replaced where one was at hand)
        self.join_timeout, self.keep_warm = join_timeout, keep_warm
        self._standby: list[LeafLink] = []  # warm leaves outside this round (reused first)
        if isinstance(listen, LeafRegistry):
            self._registry, owned = [listen], []
        else:
            self._registry = owned = [] if listen is None else [LeafRegistry(listen, token or b"")]
        self._finalizer = weakref.finalize(self, shutdown, self._leaves, self._slots, owned,
                                           self._standby)
        try:
            self.scale(leaves)
        except PlinthError:
            self.close()
            raise

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
        return [leaf.pid for leaf in self._leaves]

    @property
    def address(self) -> str | None:
        """Where external leaves join (None: this tree spawns its own)."""
        return self._registry[0].address if self._registry else None

    @property
    def standby(self) -> list[int]:
        """Pids of joined external leaves kept warm outside the round."""
        return [leaf.pid for leaf in self._standby]

    def blocks(self) -> list[str]:
        """Names of the shared-memory blocks the tree holds now (slots, partial sums)."""
        return [s.name for s in self._slots] + \
            [leaf.partial.name for leaf in [*self._leaves, *self._standby]]

    @property
    def update_bytes(self) -> int:
        """Bytes of one update in the template's layout (what a leaf folds per update)."""
        return self._raw_bytes

    def _spawn(self, wait: bool) -> LeafLink | None:
        """A new active leaf: spawned here, or a joined external one (a standby leaf first;
        with `wait`, up to `join_timeout` for one to join). None if no external one came."""
        if not self._registry:
            while self._standby:  # a warm one first: no process start, no kernel load
                leaf = self._standby.pop(0)
                if leaf.idle_alive():
                    return leaf
                leaf.release(0)
            return LeafLink.spawn(self.template, self._partial_bytes, self.threads)
        reg = self._registry[0]
        deadline = time.monotonic() + (self.join_timeout if wait else 0.0)
        while True:
            while True:  # adopt what joined since
                try:
                    conn, pid = reg.joined.get_nowait()
                except queue.Empty:
                    break
                try:
                    self._standby.append(LeafLink.adopt(conn, pid, self.template,
                                                     self._partial_bytes))
                except OSError:
                    conn.close()
            while self._standby:
                leaf = self._standby.pop(0)
                if not leaf.idle_alive():
                    log.warning("aggregator leaf (pid %d) left while on standby", leaf.pid)
                    leaf.release(0)
                    continue
                return leaf
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                reg.joined.put(reg.joined.get(timeout=left))
            except queue.Empty:
                return None

    def scale(self, leaves: int) -> int:
        """Set the number of active leaves (between rounds): start new leaf processes or retire
        the newest ones; the slot pool follows. Returns the number of leaves."""
        if leaves < 1:
            raise PlinthError(f"hierarchy: leaves must be >= 1 (got {leaves})")
        if self._in_round:
            raise PlinthError("hierarchy: scale() between rounds only (finish() first)")
        with self._lock:
            return self._scale(leaves)

    def _scale(self, leaves: int) -> int:
        while len(self._leaves) < leaves:
            leaf = self._spawn(wait=not self._leaves)
            if leaf is None:
                break
            self._leaves.append(leaf)
        if not self._leaves:
            raise PlinthError(f"hierarchy: no aggregator leaf joined {self.address} within "
                              f"{self.join_timeout:g}s")
        while len(self._leaves) > leaves:
            leaf = self._leaves.pop()
            leaf.idle = 0
            self._standby.insert(0, leaf)
        for leaf in [x for x in self._standby if not x.external]:
            # a leaf of ours idle for more than keep_warm rounds is stopped; an external one is
            # the controller's to stop (the server reports how many the round wants)
            leaf.idle += 1
            if leaf.idle > self.keep_warm:
                self._standby.remove(leaf)
                leaf.release(10)
        want = self._fixed_slots if self._fixed_slots is not None else 2 * leaves + 2
        # the pool shrinks when the slots past `want` are free (a late upload may still be
        # landing in one between rounds: then it shrinks next time)
        if len(self._slots) > want and set(range(want, len(self._slots))) <= set(self._free):
            drop = self._slots[want:]
            del self._slots[want:]
            del self._base[want:]
            for leaf in [*self._leaves, *self._standby]:
                self._send(leaf, ("drop", [s.name for s in drop]))
            for shm in drop:
                discard_slot(shm)
            self._free = [i for i in self._free if i < want]
        elif len(self._slots) < want:
            self._grow(want)
        return len(self._leaves)

    def wait_ready(self, timeout: float) -> bool:
        """Block until every active leaf has loaded its kernels (or `timeout`); whether they
        all did. Between rounds only: a bench's warm-up, a test that stops a folding leaf."""
        deadline = time.monotonic() + timeout
        while not all(leaf.ready for leaf in self._leaves):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._poll(min(left, 0.5))
        return True

    def _grow(self, want: int) -> None:
        while len(self._slots) < want:
            shm = shared_memory.SharedMemory(create=True, size=self._slot_bytes)
            self._base.append(np.frombuffer(shm.buf, np.uint8).ctypes.data)
            self._free.append(len(self._slots))
            self._slots.append(shm)

    # -- a round --------------------------------------------------------------------------------

    def land(self, size: int) -> np.ndarray | None:
        """A free slot as a writable buffer of `size` bytes, for the transport to receive one
        update into (from any thread); None if it cannot hold `size` bytes. Blocks while the
        pool is busy (backpressure on the upload). The slot comes back to the pool when the
        buffer and every view of it are dropped, unless `submit_arrays` handed it to a leaf."""
        if size > self._slot_bytes:
            return None
        try:
            slot = self._take_slot(landing=True)
        except PlinthError:  # the tree was closed (the task ended) while this upload waited
            return None
        with self._lock:
            self.landings += 1
            self._landed[slot] = (self.landings, size)
            buf = np.frombuffer(self._slots[slot].buf, np.uint8, count=size)
            weakref.finalize(buf, self._unland, slot, self.landings)
        return buf

    def _unland(self, slot: int, number: int) -> None:
        """A landed buffer died without being handed to a leaf: its slot is free again."""
        with self._lock:
            if self._landed.get(slot, (0, 0))[0] == number:
                del self._landed[slot]
                self._free.append(slot)
                self._handed.notify_all()

    def _find_landed(self, arrays: NDArrays) -> tuple[int, tuple[int, ...], int] | None:
        """(slot, offsets, bytes) when every array is a view inside one landed slot, laid out
        as the template says (its dtypes, C order); else None."""
        ptrs = [a.__array_interface__["data"][0] for a in arrays]
        for slot, (_, size) in self._landed.items():
            base = self._base[slot]
            if all(a.flags.c_contiguous and a.dtype == dt and base <= p
                   and p + a.nbytes <= base + size
                   for a, p, (_, dt) in zip(arrays, ptrs, self.template)):
                return slot, tuple(p - base for p in ptrs), size
        return None

    def submit(self, payload: bytes | bytearray | memoryview, weight: float,
               tag: str = "") -> None:
        """Land one encoded FitRes in shared memory and hand its reference to a leaf."""
        mv = memoryview(payload).cast("B")
        self._land(mv.nbytes, lambda buf: buf.__setitem__(slice(0, mv.nbytes), mv),
                   float(weight), tag, ())

    def submit_arrays(self, arrays: NDArrays, weight: float, tag: str = "") -> None:
        """Hand one update (arrays already checked against the template's shapes and dtypes)
        to a leaf. Arrays inside a landed slot go as their offsets (no copy); others are
        copied into a slot in the template's layout: the one copy, no encoding."""
        self._in_round = True
        with self._lock:
            found = self._find_landed(arrays)
            if found is not None:
                slot, offsets, size = found
                del self._landed[slot]  # the leaf hands it back now, not the buffer's death
                self._handed.notify_all()
                self._dispatch(Ref(self._slots[slot].name, size, float(weight), 1, tag, slot,
                                   offsets))
                return

        def write(buf: memoryview) -> None:
            copy_into(views(buf, self._layout), arrays)
        self.copied += 1
        self._land(self._raw_bytes, write, float(weight), tag,
                   tuple(off for off, _, _ in self._layout))

    def _land(self, size: int, write: Any, weight: float, tag: str,
              offsets: tuple[int, ...]) -> None:
        self._in_round = True
        if size <= self._slot_bytes:
            slot = self._take_slot(landing=False)
            write(self._slots[slot].buf)
            name = self._slots[slot].name
        else:
            slot = -1
            shm = shared_memory.SharedMemory(create=True, size=max(1, size))
            write(shm.buf)
            name = shm.name
            shm.close()
        with self._lock:
            self._dispatch(Ref(name, size, weight, 1, tag, slot, offsets))

    def _dispatch(self, ref: Ref) -> None:
        """Send `ref` to the least loaded leaf (another if that one is dead); with the lock."""
        while True:
            if not self._leaves:  # every external leaf died: wait for one to (re)join
                leaf = self._spawn(wait=True)
                if leaf is None:
                    self._undo_land(ref)
                    raise PlinthError(f"hierarchy: no aggregator leaf left and none joined "
                                      f"{self.address} within {self.join_timeout:g}s")
                self._leaves.append(leaf)
            leaf = min(self._leaves, key=lambda x: (len(x.held) + len(x.oneoffs), len(x.tags)))
            if self._send(leaf, ref):
                (leaf.held.add(ref.slot) if ref.slot >= 0 else leaf.oneoffs.add(ref.name))
                leaf.tags.append(ref.tag)
                return

    def _undo_land(self, ref: Ref) -> None:
        if ref.slot >= 0:
            self._free.append(ref.slot)
        else:
            unlink_block(ref.name)

    def _take_slot(self, landing: bool) -> int:
        """A free slot; blocks while every slot is being folded (backpressure). A landing
        leaves one slot to the copies (the landed updates wait for the server, which may be
        copying one in). If no slot comes back within `stall_timeout`, the leaves holding
        slots are stuck and are replaced."""
        deadline = time.monotonic() + self.stall_timeout
        while True:
            with self._lock:
                if not self._finalizer.alive:
                    raise PlinthError("hierarchy: the tree is closed")
                capped = landing and len(self._landed) >= len(self._slots) - 1
                if self._free and not capped:
                    return self._free.pop()
                if capped:  # waiting for the server to take a landed update, not for a leaf
                    self._handed.wait(self.stall_timeout)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    now = time.monotonic()
                    for leaf in [x for x in self._leaves if x.held and self._overdue(x, now)]:
                        self._stuck(leaf)
                    deadline = now + self.stall_timeout
                    continue
            self._poll(timeout=left)

    def _overdue(self, leaf: LeafLink, now: float) -> bool:
        """Whether a silent leaf counts as stuck: a ready one after `stall_timeout`; one still
        starting (loading numpy and the kernels, slow on a loaded machine) after `STARTUP_S`
        as well, so a slow start is not taken for a stall."""
        return leaf.ready or now - leaf.started > max(self.stall_timeout, STARTUP_S)

    def _stuck(self, leaf: LeafLink) -> None:
        leaf.kill()
        self._died(leaf, f"stopped folding for {self.stall_timeout:g}s and was killed")

    def _send(self, leaf: LeafLink, msg: Any) -> bool:
        try:
            leaf.conn.send(msg)
            return True
        except OSError:
            self._died(leaf)
            return False

    def _poll(self, timeout: float | None) -> None:
        """Wait up to `timeout` for the leaves, then read what they sent: freed slots are
        taken here, other replies go to `_inbox`. A leaf found dead is replaced. Any thread
        may poll; only the reading holds the lock."""
        with self._lock:
            conns = {leaf.conn: leaf for leaf in self._leaves}
            sentinels = {leaf.proc.sentinel: leaf for leaf in self._leaves
                         if leaf.proc is not None}
        try:
            ready = connection.wait([*conns, *sentinels], timeout)
        except OSError:  # another thread closed a dead leaf's pipe meanwhile: look again
            return
        with self._lock:
            for r in ready:
                leaf = conns.get(r) or sentinels[r]
                if leaf not in self._leaves:
                    continue
                try:
                    while leaf.conn.poll():
                        msg = leaf.conn.recv()
                        if msg[0] == "free":
                            if msg[1] >= 0:
                                leaf.held.discard(msg[1])
                                self._free.append(msg[1])
                        elif msg[0] == "ready":
                            leaf.ready = True
                        else:
                            self._inbox.append((leaf, msg))
                    if r in sentinels:
                        raise EOFError
                except (EOFError, OSError):
                    self._died(leaf)

    def _died(self, leaf: LeafLink, how: str = "") -> None:
        """Replace a dead (or stuck) leaf: its slots come back, its round's updates are lost
        (failures of the round, which goes on). An external leaf is replaced by a standby one,
        or not at all (the controller starts another)."""
        with self._lock:
            if leaf not in self._leaves:
                return
            i = self._leaves.index(leaf)
            how = how or f"died ({leaf.exitcode})"
            log.warning("aggregator leaf %d (pid %s) %s; %d updates of this round lost",
                        i, leaf.pid, how, len(leaf.tags))
            why = f"lost: aggregator leaf {i} {how} before its partial sum was taken"
            self._lost += [(t, why) for t in leaf.tags]
            self._free += sorted(leaf.held)
            leaf.held.clear()
            leaf.release(0)
            spare = self._spawn(wait=False)
            if spare is None:
                del self._leaves[i]
            else:
                self._leaves[i] = spare
            self.replaced += 1

    def finish(self, timeout: float | None = None, into: Any = None) -> TreeResult:
        """End the round: every leaf writes its partial sum, which this process folds (into
        `into`, a `StreamingAggregator`, or a fresh one); returns the sum, total weight and
        count, and the rejections, lost updates included. A leaf whose partial sum does not
        come within `timeout` (default `stall_timeout`) is stuck: replaced, its updates lost."""
        from plinth.fl.aggregate.engine import StreamingAggregator

        agg = into if into is not None else StreamingAggregator(self.template)
        rejected: list[tuple[str, str]] = []
        folded: list[int] = []
        busy: list[float] = []
        with self._lock:
            self._inbox.clear()
            # a copy: a leaf found dead while sending is taken out of (or replaced in) the list
            waiting = [leaf for leaf in list(self._leaves) if self._send(leaf, ("finish",))]
            waiting = [leaf for leaf in waiting if leaf in self._leaves]
        deadline = time.monotonic() + (self.stall_timeout if timeout is None else timeout)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                now = time.monotonic()
                with self._lock:
                    for leaf in [x for x in waiting if self._overdue(x, now)]:
                        self._stuck(leaf)
                    waiting = [leaf for leaf in waiting if leaf in self._leaves]
                deadline = now + self.stall_timeout
                continue
            self._poll(left)
            with self._lock:
                got, self._inbox = self._inbox, []
                for leaf, msg in got:
                    if msg[0] != "partial" or leaf not in waiting:
                        continue
                    waiting.remove(leaf)
                    _, weight, count, rej, nbytes, secs = msg
                    rejected += rej
                    folded.append(int(nbytes))
                    busy.append(float(secs))
                    if count:
                        agg.add_sum(views(leaf.partial.buf, self._partial_layout), weight,
                                    count)
                waiting = [leaf for leaf in waiting if leaf in self._leaves]  # dead: lost
        with self._lock:
            rejected += self._lost
            self._lost = []
            for leaf in self._leaves:
                leaf.tags = []
            self._in_round = False
        if into is not None:
            return TreeResult(agg.sums(), agg.total_weight, agg.count, rejected, folded, busy)
        try:
            return TreeResult([np.array(s, copy=True) for s in agg.sums()], agg.total_weight,
                              agg.count, rejected, folded, busy)
        finally:
            agg.close()

    def close(self) -> None:
        """Stop every leaf and free every shared-memory block."""
        with self._lock:
            self._finalizer()
            self._handed.notify_all()  # an upload waiting to land gives up
