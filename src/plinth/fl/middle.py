"""A machine's aggregator in a multi-machine LIFL tree: one update per machine goes up.

After LIFL (Qi et al., MLSys'24), aggregation is hierarchical across machines too. The clients of
one machine (or one site) join a `MiddleAggregator` instead of the server; the aggregator joins
the server as a single client. For each task from the server it runs the task on all its joined
clients with the server's own round logic (`plinth.fl.server.Server`: straggler timeout, failures
as data, eager folding into the streaming engine, the num_examples check) and answers with one
reply:

- fit: the example-weighted mean of its clients' deltas, with ``num_examples`` the sum of theirs,
  so the server's weighted mean over aggregators equals the weighted mean over every client;
- evaluate: the example-weighted loss and metrics, with the sum of the examples.

A client that fails is logged here and left out of the machine's update; if none replies, the
aggregator answers with an error, which the server records as its failure.

    downstream = GrpcTransport("0.0.0.0:9090")           # this machine's clients join here
    middle = MiddleAggregator(downstream, clients=4)
    GrpcClient("top:8080", client_id="rack-1",
               properties={"num_examples": middle.wait_for_clients()}).serve(middle.handle)
"""

from __future__ import annotations

import logging
from typing import Any

from plinth.core.errors import PlinthError
from plinth.fl import serde
from plinth.fl.aggregate.leaf_link import LeafRegistry
from plinth.fl.app import AggregationSpec, ServerSpec
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.messages import (
    Config,
    ErrorRes,
    EvaluateIns,
    EvaluateRes,
    Failure,
    FitIns,
    FitRes,
    Metrics,
    NDArrays,
)
from plinth.fl.server import Server
from plinth.fl.strategies.base import Strategy

log = logging.getLogger("plinth.fl.middle")


class _Relay(Strategy):
    """FedAvg of the machine's clients, kept as (mean delta, total examples) for the reply up,
    with the server's fit config passed down unchanged."""

    name = "relay"

    def __init__(self) -> None:
        super().__init__()
        self.config: Config = {}
        self.mean: NDArrays | None = None
        self.total = 0.0  # examples behind `mean`
        self.examples = 0

    def fit_config(self, round: int) -> Config:
        return self.config

    def aggregate_fit(self, round: int, acc: Any, failures: list[Failure]
                      ) -> tuple[NDArrays, Metrics]:
        self.mean = acc.mean() if acc.count else None
        self.total = acc.total_weight
        return self.parameters, {"updates": float(acc.count), "failures": float(len(failures))}

    def aggregate_evaluate(self, round: int, results: list[EvaluateRes],
                           failures: list[Failure]) -> tuple[float, Metrics]:
        self.examples = sum(r.num_examples for r in results)
        return super().aggregate_evaluate(round, results, failures)


class MiddleAggregator:
    """Serves the tasks of an upstream server on the clients joined to `downstream`."""

    def __init__(self, downstream: Any, *, clients: int, straggler_timeout: float = 600.0,
                 wait_timeout: float = 600.0, threads: int = 1, fraction: float = 1.0,
                 aggregation: AggregationSpec | None = None,
                 status: Checkpointer | None = None,
                 leaves: LeafRegistry | None = None) -> None:
        if clients < 1:
            raise PlinthError(f"--clients: an aggregator needs at least 1 client (got {clients})")
        self.downstream, self.clients = downstream, clients
        self.relay = _Relay()
        # `fraction` of the joined clients (every one by default, at least one) take part in
        # each task; once `clients` have joined (see `wait_for_clients`), a task runs on
        # whoever is still there. With `aggregation` in tree mode, the machine's leaves fold
        # them (the round's shape goes to `status`, which reports to the task's controller how
        # many leaf units to keep); its leaf units join at `leaves` (see `Server`).
        if not 0.0 < fraction <= 1.0:
            raise PlinthError(f"--fraction: {fraction:g} is not in (0, 1]")
        cfg = ServerSpec(fraction=fraction, min_clients=1, min_available=1,
                         straggler_timeout=straggler_timeout, wait_timeout=wait_timeout,
                         aggregation_threads=threads, aggregation=aggregation or AggregationSpec())
        self.server = Server(self.relay, downstream, cfg, checkpoint=status, leaves=leaves)

    def close(self) -> None:
        """Stop what its server started (the machine's aggregator tree)."""
        self.server.close()

    def wait_for_clients(self) -> int:
        """Block until `clients` have joined; returns their declared examples in all (what this
        aggregator declares upstream, the cap on the num_examples of its replies)."""
        if not self.downstream.wait_for(self.clients, self.server.cfg.wait_timeout):
            have = len(self.downstream.clients())
            raise PlinthError(f"aggregator: only {have} of --clients {self.clients} joined "
                              f"within {self.server.cfg.wait_timeout:g}s")
        return int(sum(float(c.properties.get("num_examples", 0))
                       for c in self.downstream.clients()))

    def handle(self, payload: bytes | bytearray) -> bytearray:
        """One task from upstream, answered for the whole machine."""
        msg = serde.decode(payload)
        try:
            if isinstance(msg, FitIns):
                return serde.encode(self._fit(msg))
            if isinstance(msg, EvaluateIns):
                return serde.encode(self._evaluate(msg))
            raise PlinthError(f"cannot serve a {type(msg).__name__}")
        except PlinthError as e:
            log.warning("aggregator: %s", e)
            return serde.encode(ErrorRes(getattr(msg, "round", -1), f"aggregator: {e}"))

    def _start(self, parameters: NDArrays) -> None:
        # the server's model for this task (the relay's own copy, never moved by it), and no
        # result left over from the last task
        self.server.initialize(parameters)
        self.relay.mean, self.relay.total, self.relay.examples = None, 0.0, 0

    def _fit(self, ins: FitIns) -> FitRes | ErrorRes:
        self._start(ins.parameters)
        self.relay.config = dict(ins.config)
        rec = self.server.fit_round(ins.round)
        assert rec is not None  # no safeguards here, so a round always runs
        for f in rec.failures:
            log.warning("round %d: client %s %s: %s", ins.round, f["cid"], f["kind"],
                        f["reason"])
        if self.relay.mean is None:
            return ErrorRes(ins.round, f"no client of this aggregator sent a usable update "
                                       f"({len(rec.failures)} failures)")
        metrics = {"clients": float(rec.updates), "client_failures": float(len(rec.failures))}
        return FitRes(ins.round, self.relay.mean, round(self.relay.total), metrics)

    def _evaluate(self, ins: EvaluateIns) -> EvaluateRes | ErrorRes:
        self._start(ins.parameters)
        ids = sorted(c.cid for c in self.downstream.clients())
        loss, metrics = self.server.federated_evaluate(ins.round, ids)
        if not self.relay.examples:
            return ErrorRes(ins.round, "no client of this aggregator sent an evaluation")
        return EvaluateRes(ins.round, float(loss), self.relay.examples, dict(metrics))
