"""The owner's side of the LIFL tree's leaves: a link to each leaf process, the address that
leaves started by the runtime join, and the shared-memory blocks' clean-up.

`Hierarchy` (hierarchy.py) keeps the pool of slots and the round; this module is what it holds
for each leaf: its pipe, its partial-sum block, the slots it has not handed back, and its process
when the tree spawned it (through `plinth.runtime.pool`; a leaf unit the runtime started has only
its connection). The leaf process itself runs `plinth.fl.aggregate.leaf.run_leaf`.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from multiprocessing import connection, shared_memory
from typing import Any

from plinth.fl.aggregate.accumulator import Template
from plinth.fl.aggregate.leaf import parse_address, run_leaf
from plinth.runtime.pool import spawn

log = logging.getLogger("plinth.fl.aggregate")


def unlink_block(name: str) -> None:
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    shm.close()
    shm.unlink()


class LeafLink:
    """This process's side of one leaf: its pipe, partial-sum block and round state, and its
    process when this tree spawned it (an external leaf has only its connection)."""

    def __init__(self, conn: Any, partial: shared_memory.SharedMemory, pid: int,
                 proc: Any = None) -> None:
        self.conn, self.partial, self.pid, self.proc = conn, partial, pid, proc
        self.held: set[int] = set()  # pool slots it has not handed back
        self.oneoffs: set[str] = set()  # one-off blocks not yet folded (it unlinks them)
        self.tags: list[str] = []  # updates given to it this round
        self.ready = False  # it has loaded the kernels and folds from now on
        self.idle = 0  # rounds spent on standby
        self.started = time.monotonic()

    def idle_alive(self) -> bool:
        """Whether a leaf outside the round is still there (it sends only "ready" unasked)."""
        try:
            while self.conn.poll(0):
                if self.conn.recv()[0] == "ready":
                    self.ready = True
        except (EOFError, OSError):
            return False
        return True

    @classmethod
    def spawn(cls, template: Template, partial_bytes: int, threads: int) -> LeafLink:
        """A leaf process of this tree's own (started by `plinth.runtime.pool`)."""
        partial = shared_memory.SharedMemory(create=True, size=max(1, partial_bytes))
        conn, child = connection.Pipe()
        proc = spawn(run_leaf, child, template, partial.name, threads)
        child.close()  # so that the leaf sees EOF if this process dies
        return cls(conn, partial, proc.pid, proc)

    @classmethod
    def adopt(cls, conn: Any, pid: int, template: Template, partial_bytes: int) -> LeafLink:
        """A leaf the runtime started, joined with the task's token: give it the model."""
        partial = shared_memory.SharedMemory(create=True, size=max(1, partial_bytes))
        conn.send(("init", template, partial.name))
        return cls(conn, partial, pid)

    @property
    def external(self) -> bool:
        return self.proc is None

    @property
    def exitcode(self) -> Any:
        return "its connection closed" if self.proc is None else \
            f"exit code {self.proc.exitcode}"

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(5)
        else:  # not ours to kill: cut it off; the runtime sees its unit end
            self.conn.close()

    def release(self, wait: float) -> None:
        """Stop (politely, then by force, if it is ours), and free its partial block."""
        try:
            self.conn.send(("stop",))
        except OSError:
            pass
        if self.proc is not None:
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
            unlink_block(name)
        self.oneoffs.clear()


class LeafRegistry:
    """The aggregator address external leaves join (a thread accepts; the tree adopts)."""

    def __init__(self, address: str, token: bytes) -> None:
        self.listener = connection.Listener(parse_address(address), authkey=token)
        addr = self.listener.address
        self.address = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        self.joined: queue.Queue[tuple[Any, int]] = queue.Queue()
        self.refused = 0  # joins with a wrong token
        self._closing = False
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name="fl-leaf-registry")
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn = self.listener.accept()  # the HMAC challenge runs here
            except (connection.AuthenticationError, EOFError, ConnectionError) as e:
                if self._closing:
                    return
                self.refused += 1
                log.warning("aggregator registry: a leaf was refused (%s)", e)
                continue
            except OSError:  # the listener was closed
                return
            try:
                if not conn.poll(10):
                    raise EOFError("no hello within 10s")
                kind, pid = conn.recv()
                if kind != "hello":
                    raise EOFError(f"expected hello, got {kind!r}")
            except (EOFError, OSError, ValueError, TypeError) as e:
                log.warning("aggregator registry: a leaf did not introduce itself (%s)", e)
                conn.close()
                continue
            self.joined.put((conn, int(pid)))

    def close(self) -> None:
        """Stop accepting, and free the address. A thread blocked in accept() keeps the socket
        (and its port) open after the listener is closed, so it is woken first by a connection
        that says nothing."""
        if self._closing:
            return
        self._closing = True
        addr = self.listener.address
        try:
            if isinstance(addr, tuple):
                socket.create_connection(addr[:2], timeout=1).close()
            else:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(1)
                    s.connect(addr)
        except OSError:
            pass
        self._thread.join(5)
        self.listener.close()


def shutdown(leaves: list[LeafLink], slots: list[shared_memory.SharedMemory],
              registry: list[LeafRegistry], standby: list[LeafLink]) -> None:
    for reg in registry:
        reg.close()
    for leaf in [*leaves, *standby]:
        leaf.release(10)
    leaves.clear()
    standby.clear()
    for shm in slots:
        discard_slot(shm)
    slots.clear()


def discard_slot(shm: shared_memory.SharedMemory) -> None:
    """Unmap and unlink a slot. One a landed buffer still views stays mapped until that view
    dies; one already unlinked is gone (an external leaf killed between mapping it and telling
    its resource tracker that the block is not its own: the tracker unlinks it)."""
    try:
        shm.close()
    except BufferError:
        pass
    try:
        shm.unlink()
    except FileNotFoundError:
        pass
