"""One leaf aggregator of the LIFL tree: the process side, and how an external leaf joins.

A leaf folds the updates its owner (`hierarchy.Hierarchy`, the node's middle aggregator) lands
in shared memory: it receives a small `Ref` per update (the slot and where each array starts in
it), maps the slot, folds zero-copy views with the streaming engine and hands the slot back. On
"finish" it writes its partial sum into its own block and reports it with the bytes it folded
and its busy seconds (the throughput the tree is sized by).

A leaf is either spawned by its owner, or started by the runtime as a unit of the task and
joined to the owner (`join`): it dials the owner's aggregator address (loopback or a UNIX
socket: shared memory needs the same node), proves it holds the task's token (an HMAC
challenge, `multiprocessing.connection`), and gets the model's template and its partial-sum
block. Its CPUs are the runtime's to give; nothing here pins it.

    python -m plinth.fl.aggregate.leaf --connect 127.0.0.1:7070 --token-file TOKEN
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from multiprocessing import connection, shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl import serde
from plinth.fl.aggregate.accumulator import Template
from plinth.fl.messages import FitRes, NDArrays

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
    # where each of the template's arrays starts in the block (the owner checked them there);
    # empty: the block holds an encoded FitRes, decoded and checked here
    offsets: tuple[int, ...] = ()



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


def _fold_block(agg: Any, buf: memoryview, ref: Ref, lay: Layout) -> str | None:
    """Fold the update in `buf`; returns why it was rejected, or None. Every view into `buf`
    dies with this frame, so the block can be closed afterwards."""
    from plinth.fl.aggregate.engine import UpdateRejected

    try:
        if ref.offsets:
            at = [(off, shape, dt) for off, (_, shape, dt) in zip(ref.offsets, lay)]
            agg.add(views(buf, at), ref.weight)
        else:
            agg.add(serde.decode(buf[: ref.size], expect=FitRes).update, ref.weight)
    except (UpdateRejected, serde.SerdeError) as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a bad update must not kill the aggregator
        return f"{type(e).__name__}: {e}"
    return None


def copy_into(dst: NDArrays, src: NDArrays) -> None:
    for d, x in zip(dst, src):
        np.copyto(d, x, casting="no")


def _attach(name: str, external: bool) -> shared_memory.SharedMemory:
    """Map the owner's block `name`. A leaf the owner did not spawn has its own resource
    tracker, which would unlink the owner's blocks when the leaf exits: it must not track them."""
    shm = shared_memory.SharedMemory(name=name)
    if external:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def run_leaf(conn: Any, tmpl: Template, partial: str, threads: int,
             external: bool = False) -> None:
    """One leaf aggregator process (see `_fold_loop`), with BLAS pinned to one thread: the
    fold is one compiled kernel, and a BLAS pool would only fight it for the unit's CPUs."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        _fold_loop(conn, tmpl, partial, threads, external)


def _fold_loop(conn: Any, tmpl: Template, partial: str, threads: int, external: bool) -> None:
    """One leaf aggregator process: fold refs until "finish", then write the partial sum into
    its block and report it with its busy time; slots are handed back as soon as they are
    folded. Its CPUs are the runtime's to give (no pinning here)."""
    from plinth.fl.aggregate.engine import StreamingAggregator, acc_dtype

    lay = layout(tmpl)[0]
    agg = StreamingAggregator(tmpl, threads=threads)
    _warm(tmpl)  # load the compiled kernels now, so the measured busy time is folding only
    conn.send(("ready",))
    out = _attach(partial, external)
    out_views = views(out.buf, layout([(s, acc_dtype(d)) for s, d in tmpl])[0])
    rejected: list[tuple[str, str]] = []
    mapped: dict[str, shared_memory.SharedMemory] = {}
    busy, folded = 0.0, 0
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the tree's owner is gone
                break
            if isinstance(msg, Ref):
                t0 = time.perf_counter()
                if msg.slot >= 0:  # a pool slot: map it once, keep it mapped
                    shm = mapped.get(msg.name)
                    if shm is None:
                        shm = mapped[msg.name] = _attach(msg.name, external)
                    why = _fold_block(agg, shm.buf, msg, lay)
                else:  # a one-off block: this leaf unlinks it
                    shm = _attach(msg.name, external)
                    try:
                        why = _fold_block(agg, shm.buf, msg, lay)
                    finally:
                        shm.close()
                        shm.unlink()
                busy += time.perf_counter() - t0
                folded += msg.size
                conn.send(("free", msg.slot))
                if why is not None:
                    rejected.append((msg.tag, why))
            elif msg[0] == "finish":
                copy_into(out_views, agg.sums())
                conn.send(("partial", agg.total_weight, agg.count, rejected, folded, busy))
                agg.reset()
                rejected, busy, folded = [], 0.0, 0
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


def _warm(tmpl: Template) -> None:
    """Fold one tiny update per dtype of the model (numba loads its kernels on first use)."""
    from plinth.fl.aggregate.engine import StreamingAggregator

    for dt in {d for _, d in tmpl}:
        warm = StreamingAggregator([((1,), dt)])
        warm.add([np.zeros(1, dt)], 1.0)
        warm.close()


def parse_address(address: str) -> Any:
    """"host:port" (loopback only) or a UNIX socket path, as `multiprocessing.connection`
    takes it. A leaf shares the node's memory with its owner, so no other host may join."""
    if ":" not in address:
        return address
    host, _, port = address.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise PlinthError(f"aggregator address {address!r}: leaves join over loopback or a UNIX "
                          f"socket (they share the node's memory)")
    return (host, int(port))


def join(address: str, token: bytes, *, threads: int = 1, connect_timeout: float = 30.0
         ) -> None:
    """Join the owner at `address` with the task's `token`, then fold until told to stop.
    The owner may not be listening yet (units start in any order): dial until
    `connect_timeout`."""
    where = parse_address(address)
    deadline = time.monotonic() + connect_timeout
    while True:
        try:
            conn = connection.Client(where, authkey=token)
            break
        except connection.AuthenticationError:
            raise PlinthError(f"aggregator {address}: the token was refused") from None
        except (ConnectionRefusedError, FileNotFoundError) as e:
            if time.monotonic() >= deadline:
                raise PlinthError(f"aggregator {address}: nobody listening after "
                                  f"{connect_timeout:g}s ({e})") from None
            time.sleep(0.1)
    try:
        conn.send(("hello", os.getpid()))
        kind, tmpl, partial = conn.recv()
        if kind != "init":
            raise PlinthError(f"aggregator {address}: expected init, got {kind!r}")
        run_leaf(conn, tmpl, partial, threads, external=True)
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m plinth.fl.aggregate.leaf",
                                 description="A leaf aggregator joining an FL server's tree.")
    ap.add_argument("--connect", required=True, help="the server's aggregator address")
    ap.add_argument("--token-file", required=True, help="file holding the task's token")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--connect-timeout", type=float, default=30.0)
    args = ap.parse_args(argv)
    try:
        token = Path(args.token_file).read_bytes().strip()
        join(args.connect, token, threads=args.threads, connect_timeout=args.connect_timeout)
    except (PlinthError, OSError) as e:
        print(f"leaf: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # run the installed module's main, so that the `Ref`s the owner pickles are this `Ref`
    from plinth.fl.aggregate.leaf import main as _main

    sys.exit(_main())
