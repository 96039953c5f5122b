"""Federated tasks as platform workloads: the FLTask kind's controller.

An FL app YAML submitted with `plinth submit` (`kind: FLTask`) becomes a workload whose unit
`server` is an ordinary job: `plinth fl server` with the task's resources, tenant and quota.
It listens on its own node's address (PLINTH_NODE_ADDRESS) on a free port and reports the
address it bound (`plinth.fl.reports`); the controller keeps it in the task's status
(`address`), where `plinth show TASK` prints it and `plinth fl client --task TASK` finds it.
Remote clients connect to it over gRPC with their tokens (`transport.tokens` is required: the
address is reachable by anyone who can reach the node). The server checkpoints every round into
the unit's folder, which stays the same across the jobs that replace it, so a server that dies,
or is lost with its node, is started again with `--resume` and goes on from its last round;
after `kill -9` of the control plane a running server is re-adopted as any job.

An address is known only while the unit that reported it runs: once that unit is not running,
the controller forgets it, and the next attempt reports its own. A unit that connects to
another (a middle to the server, a leaf to its parent) is started only once its parent's address
is known, with that address; one that was started with an address its parent no longer has (the
parent started again, here or on another node) is stopped and started again with the new one.

With `server.aggregation.mode: tree` (and no `leaf_listen` of the user's own), the tree's leaf
aggregators are units too: `leaf-0..N-1`, each `plinth fl leaf` joining the server on loopback
(the port the server reports as `leaf_address`) with a token the controller writes for them.
They are placed on the server's node (`colocate_with`), as LIFL places leaves beside the
aggregator they feed, so their updates pass through shared memory. The server sizes the tree
each round (`size_tree`) and reports the size; the controller keeps that many leaf units and one
warm spare, up to `max_leaves`.

With `server.aggregation.middles: N` the tree has a level per node, as in LIFL: N middle
aggregator units `middle-0..N-1` (`plinth fl aggregator`), each kept on a node of its own
(`apart_from`), each listening on its node and reporting its addresses as the server does, each
with leaf units `middle-K.leaf-J` on its node, sized by its own report as above. Client `cid`
joins middle `cid mod N` with its token (`client_address`); the middles join the server with
tokens the controller writes, so the server folds one update per node. The task's
`server.fraction` is drawn by each middle from its own clients (the server asks every middle
each round).

After each round it commits, the server reports it (`plinth.fl.reports`, over the control
plane's API with its unit's own credential; see `plinth.runtime.report`) with the rounds before
it, so a report lost while the control plane restarts is made good by the next. The controller
keeps them in the task's status: the round, accuracy per round, participants, failures and the
privacy budget spent, which `plinth show TASK` prints. The task succeeds when its server does,
and fails after `MAX_RESTARTS` failed servers.

A task has two folders (see plinth.control.tenantfs). What the controller writes for its units
(the apps, with paths made absolute, and the tokens of leaves and middles) is in the control
plane's own (`Context.files`), which the tenant's jobs read and cannot write or swap: it is
never written into a folder the tenant owns, so a link or a FIFO planted there sends no write
of the control plane's anywhere. What the units write (the server's checkpoint and
`results.json`) is in the tenant's own (`Context.state_dir`), made there by the units, as the
tenant; the controller never reads it.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from plinth.core.errors import SpecError
from plinth.core.jobspec import JobSpec, Resources
from plinth.core.kinds import (
    BaseController,
    Context,
    Files,
    Observed,
    Unit,
    Workload,
    WorkloadState,
)
from plinth.core.lifecycle import State
from plinth.fl.reports import RECENT_ROUNDS, ServerReport, TreeReport

MAX_RESTARTS = 3
WARM_LEAVES = 1  # leaf units kept beyond the round's tree, ready for the next
LEAF = Resources(cpus=0.25, memory=512)  # per leaf aggregator unit: LIFL packs them by CPU
MIDDLE = Resources(cpus=0.5, memory=1024)  # per middle aggregator unit (it relays and routes)
LEAF_LISTEN = "127.0.0.1:0"  # leaves join on their node's loopback, on a port it reports


@dataclass(frozen=True, slots=True)
class _Dirs:
    state: Path  # the task's folder in its tenant's own (its units make what is in it)
    files: Files  # the control plane's folder of what it hands the units


class FLTaskController(BaseController):
    kind = "FLTask"

    def __init__(self) -> None:
        self._dirs: dict[int, _Dirs] = {}  # per active task, from `start`

    def check(self, w: Workload, ctx: Context) -> None:
        spec = w.spec
        if spec.admm is not None:
            raise SpecError("admm: a decentralised task has no server to run; use "
                            "`plinth fl admm FILE`")
        if not spec.transport.tokens:
            raise SpecError("transport.tokens: an FLTask's server is reachable on the network, "
                            "so its clients need tokens (`plinth fl tokens FILE --clients N`)")
        tokens = Path(spec.resolve(spec.transport.tokens) or "")
        if not tokens.is_file():
            raise SpecError(f"transport.tokens: no such file {str(tokens)!r}")
        middles = spec.server.aggregation.middles
        nodes = ctx.capacity().nodes
        if middles > nodes:
            raise SpecError(f"server.aggregation.middles: {middles} middle aggregators need a "
                            f"node each, and the cluster has {nodes}")
        if middles > spec.data.clients:
            raise SpecError(f"server.aggregation.middles: {middles} middle aggregators for "
                            f"{spec.data.clients} clients (data.clients) leave one without any")

    def _dir(self, w: Workload) -> Path:
        return self._dirs[w.id].state

    def _files(self, w: Workload) -> Files:
        return self._dirs[w.id].files

    def start(self, w: Workload, ctx: Context) -> None:
        """Write the app where the server's job reads it (paths in it made absolute, so it
        runs from any folder)."""
        self._dirs[w.id] = _Dirs(ctx.state_dir(w), ctx.files(w))
        doc = w.spec.model_dump(mode="json", exclude={"base_dir", "checkpoint_dir", "tenant",
                                                       "resources", "priority"})
        for key in ("code",):
            doc[key] = w.spec.resolve(doc.get(key))
        t = doc["transport"]
        t["tokens"] = w.spec.resolve(t.get("tokens"))
        if t.get("tls"):
            t["tls"] = {k: w.spec.resolve(v) for k, v in t["tls"].items()}
        if doc.get("consent"):
            doc["consent"]["registry"] = w.spec.resolve(doc["consent"]["registry"])
        if self._leaves(w):  # the tree's leaves are this task's units: they join its node
            doc["server"]["aggregation"] |= {"leaf_listen": LEAF_LISTEN,
                                             "leaf_token_file": self._token(w, "leaf.token")}
        if doc["server"]["aggregation"]["middles"]:
            self._middle_apps(w, doc)
        self._write(w, "app.yaml", yaml.safe_dump(doc, sort_keys=False))
        w.status.setdefault("round", 0)
        w.status.setdefault("rounds", w.spec.server.rounds)

    def _write(self, w: Workload, name: str, text: str) -> str:
        """Write a file for the task's units (readable by its tenant's group only); its path."""
        return str(self._files(w).write(name, text))

    def _token(self, w: Workload, name: str) -> str:
        """A token file for the task's units, made once from the OS CSPRNG; its path."""
        files = self._files(w)
        return str(files.dir / name) if files.read(name) is not None else \
            self._write(w, name, secrets.token_urlsafe(32))

    def _middle_apps(self, w: Workload, doc: dict[str, Any]) -> None:
        """With middles: each middle's app (its tree of leaves, the clients' tokens), and the
        server's (every middle joins it each round with a token of its own)."""
        n, agg = doc["server"]["aggregation"]["middles"], doc["server"]["aggregation"]
        clients = w.spec.data.clients
        w.status.setdefault("middles", [
            {"name": f"middle-{k}", "clients": len(range(k, clients, n))} for k in range(n)])
        upstream = []
        for m in w.status["middles"]:
            name = m["name"]
            token = self._token(w, f"{name}/upstream.token")
            upstream.append(f"{name} {Path(token).read_text().strip()}")  # the plane's own file
            mid = {**doc, "server": {**doc["server"], "aggregation": {
                **agg, "middles": 0, "leaf_listen": LEAF_LISTEN,
                "leaf_token_file": self._token(w, f"{name}/leaf.token")}}}
            self._write(w, f"{name}/app.yaml", yaml.safe_dump(mid, sort_keys=False))
        doc["server"] |= {"fraction": 1.0, "min_clients": 1, "min_available": n,
                          "aggregation": {"mode": "stream"}}
        doc["transport"] = {**doc["transport"], "tokens": self._write(
            w, "middles.tokens", "\n".join(upstream) + "\n")}

    def units(self, w: Workload, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        server = observed.get("server")
        if server is not None and server.state is State.SUCCEEDED:
            return []
        if server is not None and server.state.terminal and \
                w.status.get("restarts", 0) >= MAX_RESTARTS:
            return []
        if server is not None and server.state.terminal and \
                w.status.get("failed_server_job") != server.job_id:  # count each failure once
            w.status["restarts"] = w.status.get("restarts", 0) + 1
            w.status["failed_server_job"] = server.job_id
        _forget(w.status, observed.get("server"))
        for m in w.status.get("middles", []):
            _forget(m, observed.get(m["name"]))
        d, files = self._dir(w), self._files(w).dir
        command = [sys.executable, "-m", "plinth.cli.main", "fl", "server", str(files / "app.yaml"),
                   "--checkpoint", str(d / "server"), "--resume", "--json",
                   str(d / "results.json")]
        out = [Unit("server", self._job(w, "server", command, w.spec.resources))]
        if self._leaves(w):
            out += self._leaf_units(w, "server", w.status.get("leaf_address"), files, observed)
        # Middles stay while a failed server is started again: they, like clients, join it
        # again (at its new address, started again with it). A middle that has succeeded was
        # told by the server that the task is over.
        middles = [m for m in w.status.get("middles", [])
                   if getattr(observed.get(m["name"]), "state", None) is not State.SUCCEEDED]
        at = {m["name"]: _upstream(w.status, m["name"], w.status.get("address"), observed)
              for m in middles}
        for m in middles:  # those left out have no leaves either: they would follow no one
            name, md, mf = m["name"], d / m["name"], files / m["name"]
            if at[name] is None:
                continue
            command = [sys.executable, "-m", "plinth.cli.main", "fl", "aggregator",
                       str(mf / "app.yaml"), "--server", at[name],
                       "--clients", str(m["clients"]), "--name", name,
                       "--token-file", str(mf / "upstream.token"), "--status-dir", str(md),
                       "--fraction", str(w.spec.server.fraction)]
            out.append(Unit(name, self._job(w, name, command, MIDDLE), apart_from=tuple(
                x for x, there in at.items() if there is not None and x != name)))
            out += self._leaf_units(w, name, m.get("leaf_address"), mf, observed)
        if w.status.get("round", 0) >= w.spec.server.rounds:
            # The last round is in: the units still up finish on their own, and none that
            # ended is started again (a leaf whose middle is closing would be, and a launch
            # can hold the loop for seconds on Ray).
            out = [u if u.name == "server" else replace(u, colocate_with=None, apart_from=())
                   for u in out if u.name == "server" or _live(observed.get(u.name))]
        return out

    def _job(self, w: Workload, unit: str, command: list[str], resources: Resources) -> JobSpec:
        return JobSpec(name=f"{w.name}.{unit}", tenant=w.tenant, command=command,
                       resources=resources, priority=w.spec.priority, preemptible=False,
                       env={"OMP_NUM_THREADS": "1"})

    def _leaf_units(self, w: Workload, parent: str, address: str | None, folder: Path,
                    observed: Mapping[str, Observed]) -> list[Unit]:
        """The leaves of `parent` (the server, or a middle), on its node, joining it at
        `address` (None: not known now; see `_upstream`): the round's tree (as its unit last
        reported it) and a warm spare, at most max_leaves; before the first round, the tree's
        first size and the spare. `folder`: where their token is."""
        agg = w.spec.server.aggregation
        want = w.status.get("leaves", {}).get(parent)
        if want is None:
            want = 1 if agg.leaves == "auto" else agg.leaves
        prefix = "" if parent == "server" else f"{parent}."
        out = []
        for k in range(min(agg.max_leaves, want + WARM_LEAVES)):
            name = f"{prefix}leaf-{k}"
            at = _upstream(w.status, name, address, observed)
            if at is not None:
                command = [sys.executable, "-m", "plinth.cli.main", "fl", "leaf", "--connect",
                           at, "--token-file", str(folder / "leaf.token")]
                out.append(Unit(name, self._job(w, name, command, LEAF), colocate_with=parent))
        return out

    @staticmethod
    def _leaves(w: Workload) -> bool:
        """Whether the server's tree leaves are the task's units (with middles, the middles'
        leaves are)."""
        agg = w.spec.server.aggregation
        return agg.mode == "tree" and agg.leaf_listen is None and not agg.middles

    def finished(self, w: Workload, observed: Mapping[str, Observed]) -> WorkloadState | None:
        server = observed.get("server")
        if server is None or not server.state.terminal:
            return None
        if server.state is State.SUCCEEDED:
            return WorkloadState.SUCCEEDED
        return WorkloadState.FAILED if w.status.get("restarts", 0) >= MAX_RESTARTS else None

    def end(self, w: Workload, ctx: Context) -> None:
        self._dirs.pop(w.id, None)

    # --- what the units report --------------------------------------------------------------

    def report_model(self, w: Workload, unit: str) -> type[BaseModel] | None:
        if unit == "server":
            return ServerReport
        return TreeReport if unit in {m["name"] for m in w.status.get("middles", [])} else None

    def report(self, w: Workload, unit: str, body: BaseModel, ctx: Context) -> bool:
        """A middle's addresses and tree size, or the server's: its addresses, tree size and
        the rounds it has committed (those not in the status yet go in, with the privacy budget
        spent)."""
        where = w.status if unit == "server" else \
            next(m for m in w.status["middles"] if m["name"] == unit)
        changed = False
        for key in ("address", "leaf_address"):
            value = getattr(body, key, None)
            if value is not None and where.get(key) != value:
                where[key] = value
                changed = True
        leaves = getattr(body, "leaves", None)
        if leaves is not None and w.status.get("leaves", {}).get(unit) != leaves:
            w.status.setdefault("leaves", {})[unit] = leaves
            changed = True
        if not isinstance(body, ServerReport):
            return changed
        per_round = w.status.setdefault("per_round", [])
        for rec in body.rounds:
            if rec.round <= w.status.get("round", 0):
                continue
            per_round.append(rec.model_dump())
            w.status.update(round=rec.round, participants=rec.participants,
                            updates=rec.updates, failures=rec.failures)
            if rec.epsilon is not None:
                w.status["epsilon"] = rec.epsilon
            ctx.count("fl_round", w.name, seconds=rec.seconds or 0.0,
                      updates=rec.updates or 0, failures=rec.failures)
            changed = True
        del per_round[:-RECENT_ROUNDS]
        dp = w.spec.privacy.dp or w.spec.privacy.local_dp
        if dp is not None:
            w.status["epsilon_budget"] = dp.epsilon_budget
        return changed


def _live(o: Observed | None) -> bool:
    return o is not None and not o.state.terminal


def _forget(where: dict[str, Any], o: Observed | None) -> None:
    """A unit's reported addresses hold while it runs; not once it stops (it may start again
    elsewhere, and reports its new ones then)."""
    if o is None or o.state is not State.RUNNING:
        where.pop("address", None)
        where.pop("leaf_address", None)


def _upstream(status: dict[str, Any], name: str, now: str | None,
              observed: Mapping[str, Observed]) -> str | None:
    """The address to give unit `name`, which connects to a parent whose address is `now`
    (None: not known now); None leaves the unit out. A unit to be started gets `now`, kept in
    `status["upstream"]` as the one it was given, and is not started while `now` is not known;
    one that runs stays as it was started, unless its parent has another address now: then it
    is left out, so it is stopped, and started again with the new one on a later pass."""
    given = status.setdefault("upstream", {})
    if _live(observed.get(name)):
        was = given.get(name, now)
        return was if now is None or was == now else None
    if now is not None:
        given[name] = now
    return now


def client_address(status: Mapping[str, Any], cid: int) -> str | None:
    """Where client `cid` of a task whose status is `status` connects: the middle aggregator
    of its cid (`cid mod middles`), or the server; None while that unit has not reported it."""
    middles = status.get("middles") or []
    where = middles[cid % len(middles)] if middles else status
    return where.get("address")
