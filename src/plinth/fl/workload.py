"""Federated tasks as platform workloads: the FLTask kind's controller.

An FL app YAML submitted with `plinth submit` (`kind: FLTask`) becomes a workload whose unit
`server` is an ordinary job: `plinth fl server` with the task's resources, tenant and quota,
listening on an address the controller picks once and keeps. Remote clients connect to it over
gRPC with their tokens (`transport.tokens` is required: the address is reachable by anyone who
can reach the machine). The server checkpoints every round into the unit's folder, which stays
the same across the jobs that replace it, so a server that dies, or is lost with its node, is
started again with `--resume` and goes on from its last round; after `kill -9` of the control
plane a running server is re-adopted as any job.

With `server.aggregation.mode: tree` (and no `leaf_listen` of the user's own), the tree's leaf
aggregators are units too: `leaf-0..N-1`, each `plinth fl leaf` joining the server on loopback
with a token the controller writes into the task's folder. They are placed on the server's node
(`colocate_with`), as LIFL places leaves beside the aggregator they feed, so their updates pass
through shared memory. The server sizes the tree each round (`size_tree`, published in its
`tree.json`); the controller keeps that many leaf units and one warm spare, up to `max_leaves`.

Each second the controller reads the rounds the server has committed (its checkpoint's
`meta.sqlite`) into the task's status: the round, accuracy per round, participants, failures
and the privacy budget spent, which `plinth show TASK` prints. The task succeeds when its
server does, and fails after `MAX_RESTARTS` failed servers.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from plinth.control.kinds import Observed, Unit, Workload
from plinth.control.spec import JobSpec, Resources
from plinth.core.errors import SpecError
from plinth.core.net import free_port
from plinth.sched.lifecycle import State

MAX_RESTARTS = 3
RECENT_ROUNDS = 50  # accuracy per round kept in the status (the checkpoint has them all)
WARM_LEAVES = 1  # leaf units kept beyond the round's tree, ready for the next
LEAF = Resources(cpus=0.25, memory=512)  # per leaf aggregator unit: LIFL packs them by CPU


class FLTaskController:
    kind = "FLTask"

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self.host = host
        self.cp: Any = None

    def bind(self, cp: Any) -> None:
        self.cp = cp

    def check(self, w: Workload, cluster_cpus: float, cluster_gpus: int) -> None:
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

    def _dir(self, w: Workload) -> Path:
        return self.cp.workload_dir(w.id, w.tenant)

    def started(self, w: Workload) -> None:
        """Pick the server's address once, and write the app where the server's job reads it
        (paths in it made absolute, so it runs from any folder)."""
        w.status.setdefault("address", f"{self.host}:{free_port(self.host)}")
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
        owner = self._dir(w).stat()
        if self._leaves(w):  # the tree's leaves are this task's units: they join here
            token = self._dir(w) / "leaf.token"
            if not token.exists():
                token.write_text(secrets.token_urlsafe(32))
                token.chmod(0o600)
                os.chown(token, owner.st_uid, owner.st_gid)
            w.status.setdefault("leaf_address", f"127.0.0.1:{free_port('127.0.0.1')}")
            doc["server"]["aggregation"] |= {"leaf_listen": w.status["leaf_address"],
                                             "leaf_token_file": str(token)}
        app = self._dir(w) / "app.yaml"
        app.write_text(yaml.safe_dump(doc, sort_keys=False))
        os.chown(app, owner.st_uid, owner.st_gid)
        w.status.setdefault("round", 0)
        w.status.setdefault("rounds", w.spec.server.rounds)

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
        d = self._dir(w)
        command = [sys.executable, "-m", "plinth.cli.main", "fl", "server", str(d / "app.yaml"),
                   "--address", w.status["address"], "--checkpoint", str(d / "server"),
                   "--resume", "--json", str(d / "results.json")]
        spec = JobSpec(name=f"{w.name}.server", tenant=w.tenant, command=command,
                       resources=w.spec.resources, priority=w.spec.priority,
                       preemptible=False, env={"OMP_NUM_THREADS": "1"})
        out = [Unit("server", spec)]
        if self._leaves(w) and (server is None or not server.state.terminal):
            leaf = [sys.executable, "-m", "plinth.cli.main", "fl", "leaf", "--connect",
                    w.status["leaf_address"], "--token-file", str(d / "leaf.token")]
            out += [Unit(f"leaf-{k}", JobSpec(name=f"{w.name}.leaf-{k}", tenant=w.tenant,
                                              command=leaf, resources=LEAF,
                                              priority=w.spec.priority, preemptible=False,
                                              env={"OMP_NUM_THREADS": "1"}),
                         colocate_with="server")
                    for k in range(self._leaf_units(w))]
        return out

    @staticmethod
    def _leaves(w: Workload) -> bool:
        """Whether the task's tree leaves are its own units."""
        agg = w.spec.server.aggregation
        return agg.mode == "tree" and agg.leaf_listen is None

    def _leaf_units(self, w: Workload) -> int:
        """The round's tree (the server's `tree.json`) and a warm spare, at most max_leaves;
        before the first round, the tree's first size and the spare."""
        agg = w.spec.server.aggregation
        try:
            shape = json.loads((self._dir(w) / "server" / "tree.json").read_text())
            want = int(shape["leaves"])
        except (OSError, ValueError, KeyError, TypeError):
            want = 1 if agg.leaves == "auto" else agg.leaves
        return min(agg.max_leaves, want + WARM_LEAVES)

    def finished(self, w: Workload, observed: Mapping[str, Observed]) -> str | None:
        server = observed.get("server")
        if server is None or not server.state.terminal:
            return None
        if server.state is State.SUCCEEDED:
            self._read(w)
            return "succeeded"
        return "failed" if w.status.get("restarts", 0) >= MAX_RESTARTS else None

    def tick(self, ws: list[Workload], now: float) -> list[Workload]:
        return [w for w in ws if self._read(w)]

    def _read(self, w: Workload) -> bool:
        """The rounds committed since the last read, into the status; True if any."""
        db = self._dir(w) / "server" / "meta.sqlite"
        if not db.exists():
            return False
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
                rows = c.execute("SELECT round, record FROM rounds WHERE round > ? "
                                 "ORDER BY round", (w.status.get("round", 0),)).fetchall()
        except sqlite3.Error:
            return False
        if not rows:
            return False
        per_round = w.status.setdefault("per_round", [])
        for rnd, text in rows:
            rec = json.loads(text)
            metrics = rec.get("metrics") or {}
            clients, failed = len(rec.get("clients") or []), len(rec.get("failures") or [])
            # central DP's ε, else local DP's (per client, against the server)
            eps = next((metrics[k] for k in ("epsilon", "dp_epsilon", "local_epsilon")
                        if k in metrics), None)
            per_round.append({"round": rnd, "accuracy": rec.get("accuracy"),
                              "loss": rec.get("loss"), "participants": clients,
                              "failures": failed, "seconds": rec.get("seconds"),
                              "leaves": metrics.get("leaves"), "epsilon": eps})
            w.status.update(round=rnd, participants=clients, updates=rec.get("updates"),
                            failures=failed)
            self.cp.metrics.fl_round(w.name, seconds=float(rec.get("seconds") or 0.0),
                                     updates=int(rec.get("updates") or 0), failures=failed)
            if eps is not None:
                w.status["epsilon"] = eps
        del per_round[:-RECENT_ROUNDS]
        dp = w.spec.privacy.dp or w.spec.privacy.local_dp
        if dp is not None:
            w.status["epsilon_budget"] = dp.epsilon_budget
        return True
