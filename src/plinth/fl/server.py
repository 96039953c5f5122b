"""The FL server: rounds, client selection, straggler timeouts, eager aggregation, checkpoints.

The server is an imperative shell around pure parts: selection is a function of (clients, rng)
(`selection.py`), the strategy decides the next model, and the transport moves bytes. The server
owns the round's accumulator: the streaming engine, or with `server.aggregation.mode: tree` the
elastic aggregator tree (`aggregate/tree.py`), which it starts on the first tree round, keeps
warm across rounds and stops in `close`. Each reply is decoded and folded into the round's
accumulator *as it arrives*, weighted by the strategy; a reply that is late, malformed, for
another round, of the wrong shape or dtype, or holding NaN/Inf becomes a `Failure` record
(logged, passed to the strategy), never an exception.

Synchronous strategies run rounds: select, send, fold until all reply or the straggler timeout,
aggregate, evaluate, checkpoint. With `privacy.secagg` a round is the four SecAgg+ stages
instead (`_secagg_round`): the server sends each stage's messages, waits up to the straggler
timeout per stage, and only ever holds masked vectors and the unmasked sum. Asynchronous
strategies (FedBuff, FedAsync) keep `concurrency` clients busy and step the model whenever the
strategy is `ready`; a "round" is then one model version.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl import serde
from plinth.fl.aggregate.accumulator import Accumulator, Template, UpdateRejected, template_of
from plinth.fl.aggregate.engine import StreamingAggregator
from plinth.fl.aggregate.leaf_link import LeafRegistry
from plinth.fl.aggregate.tree import TreeAggregation
from plinth.fl.app import ServerSpec
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.compress import decompress
from plinth.fl.messages import (
    ClientInfo,
    ErrorRes,
    EvaluateIns,
    EvaluateRes,
    Failure,
    FitIns,
    FitRes,
    Metrics,
    NDArrays,
)
from plinth.fl.selection import eligible, select
from plinth.fl.strategies.base import Strategy
from plinth.fl.transport import Transport, reply_limit

if TYPE_CHECKING:
    from plinth.fl.safeguards import Safeguards

log = logging.getLogger("plinth.fl.server")

Evaluate = Callable[[NDArrays], tuple[float, Metrics]]


@dataclass(slots=True)
class RoundRecord:
    round: int
    accuracy: float | None
    loss: float | None
    seconds: float
    bytes_up: int
    bytes_down: int
    clients: list[str]
    updates: int
    failures: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""  # why the aggregate is what it is, e.g. why a SecAgg+ round aborted


class Server:
    def __init__(self, strategy: Strategy, transport: Transport, cfg: ServerSpec, *,
                 seed: int = 0, evaluate: Evaluate | None = None,
                 checkpoint: Checkpointer | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 safeguards: Safeguards | None = None,
                 leaves: LeafRegistry | None = None) -> None:
        self.strategy, self.transport, self.cfg = strategy, transport, cfg
        # where the tree's external leaves join, bound by the unit before the server (its
        # address is reported first); None: at `cfg.aggregation.leaf_listen`, if any
        self.leaves = leaves
        self.seed, self.evaluate, self.checkpoint, self.clock = seed, evaluate, checkpoint, clock
        # robust rules, DP, SecAgg, consent (see safeguards.py); None: plain streaming rounds
        self.safeguards = safeguards if safeguards is not None and safeguards.active else None
        self.stopped: str | None = None  # why the task ended before its last round
        self.records: list[RoundRecord] = []
        self.template: Template = []
        self.start_round = 1
        self._declared: dict[str, int] = {}  # num_examples each client declared on joining
        self.tree: TreeAggregation | None = None  # the aggregator tree, from its first round

    # -- setup ----------------------------------------------------------------------------------

    def initialize(self, parameters: NDArrays, *, resume: bool = False) -> None:
        """Start from `parameters`, or from the newest checkpoint when `resume` is set."""
        self.strategy.initialize(parameters)
        self.template = template_of(self.strategy.parameters)
        # a reply larger than an update of this model can be is refused before it is received
        self.transport.max_reply = reply_limit(self.strategy.parameters)
        if resume and self.checkpoint is not None:
            got = self.checkpoint.latest()
            if got is not None:
                self.strategy.initialize(got.parameters)
                self.strategy.load_state(got.state)
                self.records = [RoundRecord(**r) for r in got.records]
                self.start_round = got.round + 1
                log.info("resumed after round %d", got.round)
                if self.safeguards is not None:
                    self.safeguards.restore(self.records)

    def close(self) -> None:
        """Stop what the server started for the task: the aggregator tree's leaf processes."""
        if self.tree is not None:
            self.tree.close()
            self.tree = None

    def accumulator(self, r: int, expected: int | None = None) -> Accumulator:
        """Round r's accumulator for `expected` updates: the streaming engine, or with
        `server.aggregation.mode: tree` the aggregator tree scaled to them (started on first
        use, kept across rounds, started again if the model's shapes change)."""
        agg, params = self.cfg.aggregation, self.strategy.parameters
        if agg.mode != "tree":
            return StreamingAggregator(params, threads=self.cfg.aggregation_threads)
        if self.strategy.asynchronous:
            raise PlinthError(f"server.aggregation.mode: tree needs a synchronous strategy, "
                              f"not {self.strategy.name!r}")
        if self.tree is None or not self.tree.fits(params):
            self.close()
            self.tree = TreeAggregation.from_spec(agg, params,
                                                  threads=self.cfg.aggregation_threads,
                                                  registry=self.leaves)
        return self.tree.begin(params, expected, r)

    # -- running --------------------------------------------------------------------------------

    def run(self, rounds: int, on_round: Callable[[RoundRecord], None] | None = None
            ) -> list[RoundRecord]:
        if not self.template:
            raise PlinthError("server: initialize() must be called before run()")
        if self.strategy.asynchronous:
            self._run_async(rounds, on_round)
        else:
            for r in range(self.start_round, rounds + 1):
                rec = self.fit_round(r)
                if rec is None:
                    log.warning("task stopped before round %d: %s", r, self.stopped)
                    break
                self._finish(r, rec, on_round)
        return self.records

    def _available(self) -> list[ClientInfo]:
        need = max(self.cfg.min_available, self.cfg.min_clients)
        if not self.transport.wait_for(need, self.cfg.wait_timeout):
            have = len(self.transport.clients())
            raise PlinthError(f"server: only {have} clients joined within "
                              f"{self.cfg.wait_timeout:g}s; server.min_available and "
                              f"server.min_clients need {need}")
        pool = eligible(self.transport.clients(), self.cfg.eligibility)
        self._declared = {c.cid: int(n) for c in pool
                          if isinstance(n := c.properties.get("num_examples"), int | float)
                          and math.isfinite(n)}
        if len(pool) < self.cfg.min_clients:
            raise PlinthError(f"server: {len(pool)} eligible clients, server.min_clients is "
                              f"{self.cfg.min_clients} (see server.eligibility)")
        return pool

    def _decode(self, cid: str, fut: Future, version: int, failures: list[Failure],
                staleness_of: Callable[[int], int] | None = None
                ) -> tuple[int, tuple[NDArrays, int, int] | None]:
        """A reply's size and its (dense delta, examples, staleness), or None if it failed;
        every problem becomes a `Failure`."""
        try:
            reply = fut.result()
        except Exception as e:  # noqa: BLE001 - a lost worker or connection is data
            failures.append(Failure(cid, version, "lost", f"{type(e).__name__}: {e}"))
            return 0, None
        try:
            res = serde.decode(reply, expect=FitRes)
            if isinstance(res, ErrorRes):
                failures.append(Failure(cid, version, "error", res.message))
                return len(reply), None
            if staleness_of is None and res.round != version:
                raise UpdateRejected(f"update for round {res.round} arrived in round {version}")
            self._check_examples(cid, res.num_examples)
            self._check_consent(cid)
            staleness = 0 if staleness_of is None else staleness_of(res.round)
            delta = decompress(res.update, res.codec, res.codec_meta, self.template)
            return len(reply), (delta, res.num_examples, staleness)
        except PlinthError as e:
            self._reject(cid, version, str(e), failures)
            return len(reply), None

    def _check_examples(self, cid: str, n: Any) -> None:
        """num_examples is the client's own claim and FedAvg's weight, so a liar could dominate
        the average: it must be a positive integer no larger than the count the client
        declared when it joined (which eligibility and selection used)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UpdateRejected(f"num_examples {n!r} must be a positive integer")
        declared = self._declared.get(cid)
        if declared is not None and n > declared:
            raise UpdateRejected(f"num_examples {n} is more than the {declared} the client "
                                 f"declared when it joined")

    def _check_consent(self, cid: str) -> None:
        """An update from a client whose consent was revoked since it was selected is refused."""
        why = self.safeguards.refuses_update(cid) if self.safeguards is not None else None
        if why:
            raise UpdateRejected(why)

    def _reject(self, cid: str, version: int, why: str, failures: list[Failure]) -> None:
        log.warning("client %s rejected in round %d: %s", cid, version, why)
        failures.append(Failure(cid, version, "rejected", why))

    def _fold(self, cid: str, fut: Future, acc: Accumulator, version: int, failures: list[Failure],
              staleness_of: Callable[[int], int] | None = None) -> int:
        """Decode one reply and fold it at once; returns the reply's size."""
        size, item = self._decode(cid, fut, version, failures, staleness_of)
        if item is None:
            return size
        delta, examples, staleness = item
        why = self.strategy.refuse(staleness)
        try:
            if why is None:
                acc.add(delta, self.strategy.weight(examples, staleness))
        except PlinthError as e:
            why = str(e)
        if why is not None:
            self._reject(cid, version, why, failures)
        return size

    def _fold_batch(self, batch: list[tuple[str, Future]], acc: Accumulator, version: int,
                    failures: list[Failure]) -> int:
        """Replies that completed together are folded in one sweep (`add_many`): each chunk of
        the accumulator is then read and written once for all of them."""
        size, cids, items = 0, [], []
        for cid, fut in batch:
            n, item = self._decode(cid, fut, version, failures)
            size += n
            if item is not None:
                cids.append(cid)
                items.append(item)
        acc.name_updates(cids)  # the aggregator tree reports rejections late, by name
        weighted = [(delta, self.strategy.weight(n, s)) for delta, n, s in items]
        for j, why in acc.add_many(weighted):
            self._reject(cids[j], version, why, failures)
        return size

    def fit_round(self, r: int) -> RoundRecord | None:
        """One round; None when the safeguards stop the task before it (`self.stopped` says
        why, e.g. the DP budget)."""
        t0 = self._round_t0 = self.clock()
        rng = np.random.default_rng([self.seed, r])
        pool = self._available()
        guard = self.safeguards
        if guard is None:
            chosen = select(pool, fraction=self.cfg.fraction, min_clients=self.cfg.min_clients,
                            rng=rng)
            acc = None
        else:
            chosen, self.stopped = guard.start_round(r, pool, fraction=self.cfg.fraction,
                                                     min_clients=self.cfg.min_clients, rng=rng)
            if self.stopped is not None:
                return None
            if guard.secagg is not None:
                return self._secagg_round(r, chosen)
            acc = guard.begin(r, self.strategy.parameters, chosen)
        if acc is None:  # no safeguard collects this round's updates: the server folds them
            acc = self.accumulator(r, len(chosen))
        self._publish_tree(chosen)
        payload = serde.encode(FitIns(r, self.strategy.parameters, self.strategy.fit_config(r)))
        self.transport.landing = acc.landing  # replies land where the accumulator folds
        futures = {self.transport.submit(cid, payload): cid for cid in chosen}
        failures: list[Failure] = []
        up = 0
        deadline = t0 + self.cfg.straggler_timeout
        pending = set(futures)
        while pending:
            left = deadline - self.clock()
            if left <= 0:
                break
            done, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            batch = sorted(((futures.pop(f), f) for f in done), key=lambda x: x[0])
            done = set()  # the folded replies go now: the transport bounds the ones held
            up += self._fold_batch(batch, acc, r, failures)
            del batch
        self.transport.landing = None  # a late reply lands in a buffer of its own
        for f in pending:
            f.cancel()
            failures.append(Failure(futures[f], r, "timeout",
                                    f"no reply within {self.cfg.straggler_timeout:g}s"))
        for cid, why in acc.settle():  # the tree's late rejections: NaN/Inf, a dead leaf
            self._reject(cid, r, why, failures)
        _, metrics = self.strategy.aggregate_fit(r, acc, failures)
        if guard is not None:
            metrics = {**metrics, **guard.end_round(r, acc, chosen, failures)}
        acc.close()
        return RoundRecord(r, None, None, 0.0, up, len(payload) * len(chosen), chosen,
                           int(metrics.get("updates", 0)), [asdict(f) for f in failures],
                           metrics)

    def _publish_tree(self, chosen: list[str]) -> None:
        """With the aggregator tree, hand the round's desired shape to the checkpointer, which
        reports its size to the task's controller (to resize aggregator units)."""
        if self.tree is not None and self.checkpoint is not None:
            self.checkpoint.tree(self.tree.shape_doc(chosen))

    def _secagg_round(self, r: int, chosen: list[str]) -> RoundRecord:
        """One SecAgg+ round: setup (train + advertise keys), share keys, masked input, unmask.

        A client that does not answer a stage in time, or whose reply is refused, is a dropout
        from then on; Shamir recovery removes its masks. When too few are left the round aborts:
        the model stays, the record says why, and no client's update is revealed.
        """
        from plinth.fl.privacy.secagg import SecAggAbort
        from plinth.fl.privacy.secagg_round import ServerRound

        guard = self.safeguards
        assert guard is not None
        if len(chosen) < 3:  # a Poisson draw (DP on) can come out this small
            why = f"secagg skipped: the Poisson draw selected {len(chosen)} clients, SecAgg+ " \
                  f"needs 3; the model stays"
            log.warning("round %d: %s", r, why)
            return RoundRecord(r, None, None, 0.0, 0, 0, chosen, 0, [],
                               {"secagg_skipped": 1.0, **guard.charge_unreleased()}, why)
        d = sum(math.prod(shape) for shape, _ in self.template)
        rnd = ServerRound(guard.secagg_config(r, len(chosen), d), chosen)
        requests = rnd.setup(self.strategy.parameters, self.strategy.fit_config(r),
                             guard.distributed_dp(len(chosen)))
        failures: list[Failure] = []
        up = down = 0
        try:
            while requests:
                down += sum(len(p) for p in requests.values())
                for cid, reply in self._exchange(r, requests, failures, rnd.stage):
                    up += len(reply)
                    try:
                        self._check_consent(cid)  # refused: a dropout from now on
                    except UpdateRejected as e:
                        self._reject(cid, r, str(e), failures)
                        continue
                    failed = rnd.receive(cid, reply)
                    if failed is not None:
                        failures.append(Failure(cid, r, *failed))
                requests = rnd.advance()
        except SecAggAbort as e:
            log.warning("round %d: SecAgg+ aborted (%s); the model stays", r, e)
        acc = guard.secagg_aggregator(r, rnd, self.strategy.parameters, len(chosen))
        _, metrics = self.strategy.aggregate_fit(r, acc, failures)
        metrics = {**metrics, **guard.end_round(r, acc, chosen, failures)}
        acc.close()
        return RoundRecord(r, None, None, 0.0, up, down, chosen, int(metrics.get("updates", 0)),
                           [asdict(f) for f in failures], metrics, acc.reason)

    def _exchange(self, r: int, requests: dict[str, bytes | bytearray], failures: list[Failure],
                  what: str) -> list[tuple[str, bytes | bytearray]]:
        """Send each client its request; the replies that arrive within the straggler timeout,
        by client id. A timeout or a lost client becomes a `Failure`."""
        futures = {self.transport.submit(cid, p): cid for cid, p in requests.items()}
        done, pending = wait(futures, timeout=self.cfg.straggler_timeout)
        for f in pending:
            f.cancel()
            failures.append(Failure(futures[f], r, "timeout", f"no {what} reply within "
                                    f"{self.cfg.straggler_timeout:g}s"))
        out = []
        for f in sorted(done, key=lambda f: futures[f]):
            try:
                out.append((futures[f], f.result()))
            except Exception as e:  # noqa: BLE001 - a lost client is data
                failures.append(Failure(futures[f], r, "lost", f"{type(e).__name__}: {e}"))
        return out

    def federated_evaluate(self, r: int, clients: list[str]) -> tuple[float, Metrics]:
        """Evaluate on the clients' own data (when the server holds no test set)."""
        if not clients:
            return float("nan"), {}
        payload = serde.encode(EvaluateIns(r, self.strategy.parameters, {}))
        results, failures = [], []
        for cid, reply in self._exchange(r, dict.fromkeys(clients, payload), failures,
                                         "evaluation"):
            try:
                res = serde.decode(reply, expect=EvaluateRes)
            except PlinthError as e:
                failures.append(Failure(cid, r, "rejected", str(e)))
                continue
            if isinstance(res, ErrorRes):
                failures.append(Failure(cid, r, "error", res.message))
            elif res.round != r or not math.isfinite(res.loss):
                failures.append(Failure(cid, r, "rejected", "bad evaluation reply"))
            else:
                results.append(res)
        return self.strategy.aggregate_evaluate(r, results, failures)

    def _finish(self, r: int, rec: RoundRecord, on_round: Callable | None) -> None:
        if r % self.cfg.evaluate_every == 0:
            if self.evaluate is not None:
                loss, m = self.evaluate(self.strategy.parameters)
            else:
                loss, m = self.federated_evaluate(r, rec.clients)
            rec.loss, rec.accuracy = float(loss), m.get("accuracy")
            # other evaluation metrics (e.g. a backdoor's success rate) join the round's record
            for k, v in m.items():
                if k != "accuracy":
                    rec.metrics.setdefault(k, float(v))
        rec.seconds = self.clock() - self._round_t0
        self.records.append(rec)
        if self.checkpoint is not None:
            self.checkpoint.save(r, self.strategy.parameters, self.strategy.state(), asdict(rec))
        self._round_t0 = self.clock()
        if on_round is not None:
            on_round(rec)

    _round_t0: float = 0.0

    def _run_async(self, rounds: int, on_round: Callable | None) -> None:
        """Keep `concurrency` clients busy; step the model whenever the strategy is ready."""
        version = self.start_round - 1
        rng = np.random.default_rng([self.seed, version, 7])
        pool = self._available()
        ids = sorted(c.cid for c in pool)
        in_flight: dict[Future, tuple[str, int, float]] = {}
        payloads: dict[int, bytearray] = {}
        failures: list[Failure] = []
        acc = self.accumulator(version + 1)
        up = down = 0
        self._round_t0 = self.clock()
        busy: set[str] = set()

        def dispatch() -> int:
            nonlocal down
            idle = [c for c in ids if c not in busy]
            while len(in_flight) < self.cfg.concurrency and idle:
                cid = idle.pop(int(rng.integers(len(idle))))
                if version not in payloads:
                    payloads.clear()
                    payloads[version] = serde.encode(FitIns(version, self.strategy.parameters,
                                                            self.strategy.fit_config(version)))
                in_flight[self.transport.submit(cid, payloads[version])] = (cid, version,
                                                                            self.clock())
                busy.add(cid)
                down += len(payloads[version])
            return down

        dispatch()
        while version < rounds and in_flight:
            done, _ = wait(set(in_flight), timeout=1.0, return_when=FIRST_COMPLETED)
            now = self.clock()
            for f in list(in_flight):
                cid, started, t_sent = in_flight[f]
                if f in done:
                    up += self._fold(cid, f, acc, started, failures,
                                     staleness_of=lambda v, now_v=version: now_v - v)
                elif now - t_sent > self.cfg.straggler_timeout:
                    f.cancel()
                    failures.append(Failure(cid, started, "timeout", "no reply within "
                                            f"{self.cfg.straggler_timeout:g}s"))
                else:
                    continue
                del in_flight[f]
                busy.discard(cid)
                if acc.count and self.strategy.ready(acc):
                    version += 1
                    _, metrics = self.strategy.aggregate_fit(version, acc, failures)
                    rec = RoundRecord(version, None, None, 0.0, up, down, [], acc.count,
                                      [asdict(x) for x in failures], metrics)
                    acc.close()
                    acc = self.accumulator(version + 1)
                    failures, up, down = [], 0, 0
                    self._finish(version, rec, on_round)
                    if version >= rounds:
                        break
            dispatch()
        for f in in_flight:
            f.cancel()
        acc.close()
