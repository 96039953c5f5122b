"""Workers' output, from the Ray nodes to the jobs' log files: one call per node, not per worker.

Each worker's shim appends its output to a file on its own node (`worker_dir(NAME)/output.log`,
NAME its actor's name, beside an `id` file unique to the worker). One `NodeLogs` actor per node (named `plinth-logs-NODEID`, detached,
pinned to its node, no CPU) reads the new output of every worker there that the control plane
asks for, and keeps how much of each it has handed over, so a restarted control plane goes on
where the last one stopped. The control plane's side, `LogShipper`, asks each node once every
`every_s` for all of its running workers at once (so 8,000 workers on 1,000 nodes cost 1,000
calls, not 8,000), and appends what comes back to the jobs' log files; at a worker's end it
takes the rest of its output before the worker's folder is removed.

Only the standard library is imported at the top: the module is imported in every Ray worker
process that hosts a NodeLogs actor.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LOG_CHUNK = 1 << 20  # most bytes of one worker's output a call returns
WORKERS_DIR = "plinth-workers"


def worker_dir(name: str) -> Path:
    """The folder on its node of the worker whose actor is `name`."""
    return Path(tempfile.gettempdir()) / WORKERS_DIR / name


class NodeLogs:
    """On one node: hands over the output of that node's workers, a piece at a time."""

    def __init__(self) -> None:
        # Bytes of each worker's output handed over, with the worker's id (its folder's `id`
        # file): a worker of the same name later (another control plane's job 1) is read
        # from its start.
        self.sent: dict[str, tuple[str, int]] = {}

    def take(self, names: list[str]) -> dict[str, bytes]:
        """Output not handed over yet of each worker in `names` (up to LOG_CHUNK each); a
        worker with none is left out. A worker whose folder is gone is forgotten."""
        out = {}
        for name in names:
            folder = worker_dir(name)
            try:
                wid = (folder / "id").read_text()
                with open(folder / "output.log", "rb") as f:
                    was, at = self.sent.get(name, (wid, 0))
                    at = at if was == wid else 0
                    f.seek(at)
                    chunk = f.read(LOG_CHUNK)
            except FileNotFoundError:
                self.sent.pop(name, None)
                continue
            self.sent[name] = (wid, at + len(chunk))
            if chunk:
                out[name] = chunk
        return out


@dataclass(frozen=True, slots=True)
class Stream:
    """A worker's output, as the control plane knows it."""

    node_id: str
    name: str  # its actor's
    log_path: str  # the job's log file here
    where: str  # who it is, for a problem's message


class LogShipper:
    """The control plane's side: one pending `take` per node at a time."""

    def __init__(self, ray, namespace: str, problem: Callable[[str], None], *,
                 every_s: float = 0.5, call_timeout_s: float = 30.0) -> None:
        self.ray, self.namespace, self.problem = ray, namespace, problem
        self.every_s, self.call_timeout_s = every_s, call_timeout_s
        self._cls = ray.remote(NodeLogs)
        self._actors: dict[str, object] = {}  # node id -> its NodeLogs
        self._pending: dict[str, tuple[object, dict[str, Stream]]] = {}  # node id -> call
        self._due = 0.0

    def tick(self, streams: list[Stream], now: float) -> None:
        """Write what pending calls have brought; every `every_s`, ask each node again for
        all of `streams` on it."""
        ray = self.ray
        if self._pending:
            refs = {ref: node for node, (ref, _) in self._pending.items()}
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
            for ref in ready:
                node = refs[ref]
                self._write(self._get(node, ref), self._pending.pop(node)[1])
        if now < self._due:
            return
        self._due = now + self.every_s
        by_node: dict[str, dict[str, Stream]] = {}
        for s in streams:
            by_node.setdefault(s.node_id, {})[s.name] = s
        for node, named in by_node.items():
            actor = self._actor(node)
            if node not in self._pending and actor is not None:
                self._pending[node] = (actor.take.remote(list(named)), named)  # type: ignore

    def drain(self, streams: list[Stream]) -> None:
        """Take the rest of the output of `streams` (workers that have ended), now."""
        by_node: dict[str, dict[str, Stream]] = {}
        for s in streams:
            by_node.setdefault(s.node_id, {})[s.name] = s
        for node, named in by_node.items():
            if node in self._pending:  # its answer first, so the output stays in order
                ref, asked = self._pending.pop(node)
                self._write(self._get(node, ref), asked)
            actor = self._actor(node)
            while actor is not None and named:
                got = self._get(node, actor.take.remote(list(named)))  # type: ignore
                self._write(got, named)
                named = {n: s for n, s in named.items() if n in got}

    def _get(self, node: str, ref) -> dict[str, bytes]:
        ray = self.ray
        try:
            return ray.get(ref, timeout=self.call_timeout_s)
        except ray.exceptions.RayError as e:
            self._actors.pop(node, None)  # its node is gone, or the actor: made again if asked
            self.problem(f"node {node[:12]}: workers' output could not be fetched: "
                         f"{str(e).strip().splitlines()[-1][:200] if str(e).strip() else e!r}")
            return {}

    def _write(self, got: dict[str, bytes], named: dict[str, Stream]) -> None:
        for name, chunk in got.items():
            s = named.get(name)
            if s is None or not s.log_path:
                continue
            try:
                with open(s.log_path, "ab") as f:
                    f.write(chunk)
            except OSError as e:
                self.problem(f"{s.where}: log {s.log_path}: {e.strerror}")

    def _actor(self, node: str):
        """Node `node`'s NodeLogs, made if it has none yet (or found, if it has); None if its
        node cannot take it now. It is not restarted: it dies with its node, so that a call
        to it fails at once rather than wait for a node that will not come back."""
        actor = self._actors.get(node)
        if actor is not None:
            return actor
        ray = self.ray
        strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node, soft=False)
        try:
            actor = self._cls.options(
                name=f"plinth-logs-{node}", namespace=self.namespace, lifetime="detached",
                get_if_exists=True, num_cpus=0, max_restarts=0,
                scheduling_strategy=strategy).remote()
        except ray.exceptions.RayError as e:
            self.problem(f"node {node[:12]}: no log actor: {e}")
            return None
        self._actors[node] = actor
        return actor

