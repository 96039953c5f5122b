"""Round safeguards from the app spec: robust aggregation, central DP, SecAgg+, consent.

The server asks a `Safeguards` object three things in a synchronous round:

1. `start_round`: may the round run at all (DP: not when it would exceed the ε budget; robust
   rules: not with fewer clients than the rule needs), and who is selected (consent: only
   clients with live consent for the purpose; every exclusion and selection is audited);
2. `begin`: the round's accumulator. Robust rules and central DP need every update of the round
   at once, so they get a `CollectingAggregator`, which keeps the n updates (O(n·model) memory,
   where the streaming FedAvg engine keeps O(model)). A SecAgg+ round never holds an update:
   the server drives the protocol over the transport (`plinth.fl.privacy.secagg_round`) with
   `secagg_config` and `distributed_dp` from here, and `secagg_aggregator` turns the unmasked
   sum into the round's aggregate (and accounts distributed DP);
3. `end_round`: metrics for the round record (ε, clip, the rule's reason) and the consent
   participation log.

The decisions themselves are the pure functions of `plinth.fl.robust` and `plinth.fl.privacy`;
this file only feeds them the round's updates and keeps the state that spans rounds (the DP
accountant, the adaptive clip, the centered-clipping centre).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from plinth.core.errors import PlinthError, SpecError
from plinth.fl.aggregate.engine import UpdateRejected, check_shapes
from plinth.fl.app import (
    AppSpec,
    ConsentSpec,
    DPSpec,
    LocalDPSpec,
    RobustSpec,
    SecAggSpec,
    seeded_noise,
)
from plinth.fl.messages import ClientInfo, Failure, Metrics, NDArrays
from plinth.fl.robust.rules import RULES, RuleInputs
from plinth.fl.strategies.base import Strategy

if TYPE_CHECKING:
    from plinth.fl.privacy.secagg import SecAggConfig
    from plinth.fl.privacy.secagg_round import DistributedDP, ServerRound

log = logging.getLogger("plinth.fl.safeguards")

# vector, metrics, reason
Reduced = tuple[np.ndarray, Metrics, str]
Reduce = Callable[[np.ndarray, np.ndarray], Reduced]


def _no_reduce(rows: np.ndarray, weights: np.ndarray) -> Reduced:
    raise PlinthError("aggregator: this round has no updates to reduce")


def flatten(arrays: NDArrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays])


def unflatten(vec: np.ndarray, template: Sequence[tuple[tuple[int, ...], np.dtype]]) -> NDArrays:
    out, s = [], 0
    for shape, dt in template:
        n = math.prod(shape)
        part = vec[s:s + n].reshape(shape)
        s += n
        if np.issubdtype(dt, np.integer) or np.dtype(dt) == np.bool_:
            part = np.rint(part)
        out.append(part.astype(dt))
    return out


class CollectingAggregator:
    """Keeps every update of a round, then reduces them all at once with `reduce`.

    It answers the calls the server and the strategies make on the streaming aggregator
    (`add`, `add_many`, `mean`, `count`, `close`), so every synchronous strategy works on top of
    it: `mean()` is the rule's aggregate delta, which FedAvg, FedAvgM or FedAdam then apply.
    """

    def __init__(self, template: NDArrays, reduce: Reduce) -> None:
        self.template = [(tuple(np.shape(p)), np.asarray(p).dtype) for p in template]
        self.reduce = reduce
        self.rows: list[np.ndarray] = []
        self.weights: list[float] = []
        self.count = 0
        self.total_weight = 0.0
        self.metrics: Metrics = {}
        self.reason = ""
        self._mean: NDArrays | None = None

    @classmethod
    def reduced(cls, template: NDArrays, count: int, vec: np.ndarray, metrics: Metrics,
                reason: str) -> CollectingAggregator:
        """An aggregator closed on a result computed elsewhere (a SecAgg+ sum of `count`
        updates): `mean()` returns `vec` shaped like the model."""
        acc = cls(template, _no_reduce)
        acc.count, acc.metrics, acc.reason = count, metrics, reason
        acc._mean = unflatten(vec, acc.template)
        return acc

    def add(self, arrays: NDArrays, weight: float) -> None:
        rejected = self.add_many([(arrays, weight)])
        if rejected:
            raise UpdateRejected(rejected[0][1])

    def name_updates(self, names: Sequence[str]) -> None:
        """Rejections are returned at once here; nothing to name."""

    def settle(self) -> list[tuple[str, str]]:
        return []

    def add_many(self, updates: Sequence[tuple[NDArrays, float]]) -> list[tuple[int, str]]:
        if self._mean is not None:
            raise PlinthError("aggregator: mean() was taken; the round is closed")
        rejected = []
        for j, (arrays, w) in enumerate(updates):
            try:
                if not (math.isfinite(w) and w > 0):
                    raise UpdateRejected(f"weight {w!r} must be a finite number > 0")
                check_shapes(self.template, arrays)
                row = flatten(arrays)
                if not np.all(np.isfinite(row)):
                    raise UpdateRejected("NaN or Inf in the update")
            except UpdateRejected as e:
                rejected.append((j, str(e)))
                continue
            self.rows.append(row)
            self.weights.append(float(w))
            self.count += 1
            self.total_weight += float(w)
        return rejected

    def sums(self) -> NDArrays:
        raise PlinthError("a collecting aggregator has no running sums (synchronous rounds only)")

    def mean(self) -> NDArrays | None:
        """The rule's aggregate of the collected updates, shaped like the model."""
        if self.count == 0:
            return None
        if self._mean is None:
            vec, self.metrics, self.reason = self.reduce(np.stack(self.rows),
                                                         np.asarray(self.weights))
            self._mean = unflatten(vec, self.template)
            log.info("aggregate: %s", self.reason)
        return self._mean

    def close(self) -> None:
        self.rows.clear()


def root_trainer(spec: AppSpec) -> Callable[[NDArrays, int], np.ndarray]:
    """FLTrust's server update: one local fit from the global model on a small clean root set
    (`strategy.robust.root_examples` examples of the training split, drawn from the seed)."""
    from plinth.fl.app import load_code
    from plinth.fl.data import load_source
    from plinth.fl.torch_client import make_default_client

    assert spec.strategy.robust is not None
    train, _ = load_source(spec.data, spec.seed)
    rng = np.random.default_rng([spec.seed, 0xF17])
    k = min(len(train), spec.strategy.robust.root_examples)
    root = train.subset(np.sort(rng.choice(len(train), size=k, replace=False)))
    model = load_code(spec).make_model(spec)
    client = make_default_client(model, root, None, spec.train, spec.seed + 0xF17)

    def update(params: NDArrays, round: int) -> np.ndarray:
        new, _, _ = client.fit(params, {"round": round})
        return flatten(new) - flatten(params)

    return update


# -- the safeguards object -----------------------------------------------------------------------


class Safeguards:
    """What the app's `strategy.robust`, `privacy` and `consent` sections ask of each round."""

    def __init__(self, spec: AppSpec, *,
                 server_update: Callable[[NDArrays, int], np.ndarray] | None = None,
                 wall: Callable[[], float] = time.time, simulated: bool = False) -> None:
        self.seed = spec.seed
        # seeded DP noise and a seeded client draw only in `plinth fl sim` (see app.Noise)
        self.seeded = spec.privacy.dp is not None and seeded_noise(spec.privacy.dp.noise,
                                                                   simulated=simulated)
        self.robust: RobustSpec | None = spec.strategy.robust
        self.dp_spec: DPSpec | None = spec.privacy.dp
        self.secagg: SecAggSpec | None = spec.privacy.secagg
        self.consent: ConsentSpec | None = spec.consent
        self.task_id = (spec.consent.task_id if spec.consent and spec.consent.task_id
                        else spec.name)
        self.server_update = server_update
        self.wall = wall  # consent timestamps are wall-clock seconds since the epoch
        self.center: np.ndarray | None = None  # centered clipping: last round's aggregate
        self.sample_rate = 1.0  # DP: the round's Poisson rate q ...
        self.expected_clients = 1.0  # ... and q·N, DP-FedAvg's fixed denominator
        self.dp = None
        if self.dp_spec is not None:
            from plinth.fl.privacy.dp import AdaptiveClip, DPFedAvg, PrivacyAccountant

            d = self.dp_spec
            adaptive = None
            if d.adaptive is not None:
                adaptive = AdaptiveClip(
                    clip_norm=d.clip, target_quantile=d.adaptive.target_quantile,
                    learning_rate=d.adaptive.learning_rate,
                    count_noise_std=d.adaptive.count_noise_std or d.noise_multiplier)
            self.dp = DPFedAvg(noise_multiplier=d.noise_multiplier, expected_clients=1.0,
                               clip_norm=d.clip, adaptive=adaptive,
                               epsilon_budget=d.epsilon_budget,
                               accountant=PrivacyAccountant(kind=d.accountant, delta=d.delta))
        # local DP: the clients noise their own uploads (client.py); the server only accounts
        self.local_spec: LocalDPSpec | None = spec.privacy.local_dp
        self.local_accountant = None
        if self.local_spec is not None:
            from plinth.fl.privacy.dp import PrivacyAccountant

            self.local_accountant = PrivacyAccountant(kind=self.local_spec.accountant,
                                                      delta=self.local_spec.delta)
        self.registry = None
        if self.consent is not None:
            from pathlib import Path

            from plinth.fl.privacy.consent import ConsentRegistry

            path = Path(spec.resolve(self.consent.registry) or "")
            if not path.parent.is_dir():
                raise SpecError(f"consent.registry: folder {path.parent} does not exist")
            self.registry = ConsentRegistry(str(path))  # created empty when new
        if (self.robust is not None and RULES.get(self.robust.rule).needs_server_update
                and server_update is None):
            raise SpecError("strategy.robust.rule: fltrust needs a server that holds data "
                            "(a root set); this server has none")

    @property
    def active(self) -> bool:
        return any(x is not None for x in (self.robust, self.dp, self.secagg, self.registry,
                                           self.local_accountant))

    # -- resume ---------------------------------------------------------------------------------

    def restore(self, records: Sequence[Any]) -> None:
        """Replay the DP accounting of checkpointed rounds, so ε does not restart at zero."""
        for rec in records:
            m = rec.metrics
            if self.local_accountant is not None and self.local_spec is not None \
                    and "local_epsilon" in m:
                self.local_accountant.step(noise_multiplier=self.local_spec.noise_multiplier,
                                           sample_rate=1.0)
            if self.dp is not None and "dp_sample_rate" in m:
                self.dp.accountant.step(
                    noise_multiplier=m.get("dp_noise_multiplier", self.dp.noise_multiplier),
                    sample_rate=m["dp_sample_rate"])
                if self.dp.adaptive is not None and "dp_next_clip" in m:
                    from dataclasses import replace

                    self.dp.adaptive = replace(self.dp.adaptive, clip_norm=m["dp_next_clip"])

    # -- the round ------------------------------------------------------------------------------

    def start_round(self, r: int, pool: list[ClientInfo], *, fraction: float,
                    min_clients: int, rng: np.random.Generator) -> tuple[list[str], str | None]:
        """The round's clients, or ``([], why)`` when the task must stop before the round.

        With consent only the clients with live consent are in the pool. Without DP,
        ⌈fraction·n⌉ of the n are drawn with `rng`. With DP each is drawn independently with
        probability q = `poisson_rate(...)` from a CSPRNG (`plinth.fl.privacy.sampling`: the
        sampler the accountant assumes, and secret). The checks that may stop the task run
        before the draw, so a round that never runs audits no selection.
        """
        from plinth.fl.server import select

        ids = sorted(x.cid for x in pool)
        if self.registry is not None and self.consent is not None:
            live = set(self._consenting(r, ids, min_clients))
            pool = [x for x in pool if x.cid in live]
        if self.dp is not None:
            from plinth.fl.privacy.sampling import poisson_rate, poisson_sample

            q = poisson_rate(fraction=fraction, min_clients=min_clients, pool_size=len(pool))
            why = self.admit(r, q * len(pool), len(pool))
            chosen = [] if why else poisson_sample([x.cid for x in pool], rate=q,
                                                   source=self._selection_noise(r))
        else:
            k = min(len(pool), max(min_clients, math.ceil(fraction * len(pool))))
            why = self.admit(r, k, len(pool))
            chosen = [] if why else select(pool, fraction=fraction, min_clients=min_clients,
                                           rng=rng)
        if why:
            return [], why
        if self.registry is not None and self.consent is not None:
            self.registry.record_selection(chosen, self.consent.purpose, now=self.wall(),
                                           task_id=self.task_id, round=r)
        return chosen, None

    def _consenting(self, r: int, ids: list[str], min_clients: int) -> list[str]:
        """The ids with live consent for the task's purpose (the others audited as excluded)."""
        assert self.registry is not None and self.consent is not None
        c = self.consent
        live = self.registry.eligible(ids, c.purpose, now=self.wall(), min_version=c.min_version,
                                      task_id=self.task_id, round=r).eligible
        if len(live) < min_clients:
            raise PlinthError(f"consent: {len(live)} of {len(ids)} clients have live consent for "
                              f"{c.purpose!r}; server.min_clients is {min_clients}")
        return live

    def refuses_update(self, cid: str) -> str | None:
        """Why an update from `cid` must not be used, or None: with consent, a client whose
        consent is no longer live (revoked during the round) is refused on arrival."""
        if self.registry is None or self.consent is None:
            return None
        ver = self.registry.consent_version(cid, self.consent.purpose, now=self.wall())
        if ver is None or ver < self.consent.min_version:
            return f"consent for {self.consent.purpose!r} is not live (revoked); update refused"
        return None

    def _selection_noise(self, r: int) -> Any:
        from plinth.fl.privacy.dp import ChaChaNoise, NumpyNoise

        return NumpyNoise(np.random.default_rng([self.seed, r, 0x5E1])) if self.seeded \
            else ChaChaNoise()

    def admit(self, r: int, k: float, pool_size: int) -> str | None:
        """None if a round of `k` clients (with DP: `k` = q·N expected) drawn from `pool_size`
        may run; otherwise why the task stops before it (too few clients for the robust rule or
        SecAgg, the DP budget)."""
        need = 1 if self.robust is None else RULES.get(self.robust.rule).min_clients(self.robust)
        if self.robust is not None and k < need:
            return (f"strategy.robust: rule {self.robust.rule} with f={self.robust.f} needs at "
                    f"least {need} clients a round, round {r} selected {k}")
        if self.secagg is not None and self.dp is None and k < 3:
            return f"privacy.secagg: needs at least 3 clients a round, round {r} selected {k}"
        if self.dp is not None:
            self.sample_rate = k / max(1, pool_size)
            self.expected_clients = float(k)
            if self.dp.epsilon_budget is not None:
                from plinth.fl.privacy.dp import check_budget

                d = check_budget(self.dp.accountant, epsilon_budget=self.dp.epsilon_budget,
                                 noise_multiplier=self.dp.noise_multiplier,
                                 sample_rate=self.sample_rate)
                if not d.allowed:
                    return f"privacy.dp.epsilon_budget: {d.reason}"
        local = self.local_spec
        if local is not None and local.epsilon_budget is not None:
            from plinth.fl.privacy.dp import check_budget

            assert self.local_accountant is not None
            d = check_budget(self.local_accountant, epsilon_budget=local.epsilon_budget,
                             noise_multiplier=local.noise_multiplier, sample_rate=1.0)
            if not d.allowed:
                return f"privacy.local_dp.epsilon_budget: {d.reason}"
        return None

    def begin(self, r: int, strategy: Strategy, chosen: list[str]) -> Any:
        if self.robust is None and self.dp is None and self.secagg is None:
            return strategy.begin(r)
        params = strategy.parameters
        if self.robust is not None:
            reduce = self._robust(r, params)
        elif self.dp is not None and self.secagg is None:
            reduce = self._dp(r)
        else:  # SecAgg over collected updates, in one process: see _secagg
            reduce = self._secagg(r, len(chosen))
        return CollectingAggregator(params, reduce)

    def _robust(self, r: int, params: NDArrays) -> Reduce:
        spec = self.robust
        assert spec is not None

        rule = RULES.get(spec.rule)

        def reduce(rows: np.ndarray, weights: np.ndarray) -> Reduced:
            g0 = None
            if rule.needs_server_update:
                assert self.server_update is not None
                g0 = self.server_update(params, r)
            try:
                res = rule.reduce(spec, RuleInputs(rows, weights, self.center, g0))
            except ValueError as e:
                # fewer updates arrived than the rule needs (failures): keep the model
                log.warning("round %d: %s; the model stays", r, e)
                return np.zeros(rows.shape[1]), {"robust_skipped": 1.0}, str(e)
            self.center = res.vector
            return res.vector, {"robust_selected": float(len(res.selected))}, res.reason

        return reduce

    def _dp(self, r: int) -> Reduce:
        dp = self.dp
        assert dp is not None and self.dp_spec is not None
        from plinth.fl.privacy.dp import ChaChaNoise, NumpyNoise

        noise = (NumpyNoise(np.random.default_rng([self.seed, r, 0xD9])) if self.seeded
                 else ChaChaNoise())

        def reduce(rows: np.ndarray, weights: np.ndarray) -> Reduced:
            # DP-FedAvg: every update counts the same (clipped to C), divided by the fixed q·N,
            # not the number drawn or the number that replied, so one client moves the sum by
            # at most C whatever the Poisson draw.
            dp.expected_clients = self.expected_clients
            clip = dp.adaptive.clip_norm if dp.adaptive else dp.clip_norm
            out = dp.aggregate(rows, sample_rate=self.sample_rate, noise=noise)
            if out is None:  # admit() checked the budget first; kept as a guard
                raise PlinthError(f"privacy.dp: {dp.stopped}")
            m = {"epsilon": dp.accountant.history[-1], "dp_clip": clip,
                 "dp_clipped": float(out.num_clipped), "dp_noise_std": out.noise_std,
                 "dp_sample_rate": self.sample_rate}
            if dp.adaptive is not None:
                m["dp_next_clip"] = dp.adaptive.clip_norm
            return out.mean, m, out.reason

        return reduce

    # -- SecAgg+ ------------------------------------------------------------------------------

    def secagg_config(self, r: int, n: int, d: int) -> SecAggConfig:
        """Round r's public SecAgg+ parameters for n clients and d-value updates."""
        spec = self.secagg
        assert spec is not None
        from plinth.fl.privacy.secagg import SecAggConfig
        from plinth.fl.privacy.secagg_round import public_graph_seed

        degree = None if spec.neighbours is None else min(spec.neighbours, n - 1)
        return SecAggConfig(client_ids=tuple(range(n)), vector_len=d, round_id=r,
                            clip=spec.clip, scale=spec.scale, full_graph=spec.full_graph,
                            degree=degree, threshold_fraction=spec.threshold,
                            graph_seed=public_graph_seed(self.seed, r))

    def distributed_dp(self, expected: int) -> DistributedDP | None:
        """With privacy.dp.mode distributed: the noise share each client adds before masking;
        m is min_honest_clients, by default the round's selected clients."""
        if self.dp is None or self.dp_spec is None or self.secagg is None:
            return None
        from plinth.fl.privacy.secagg_round import DistributedDP

        return DistributedDP(self.dp.clip_norm, self.dp.noise_multiplier,
                             self.dp_spec.min_honest_clients or expected)

    def secagg_reduce(self, r: int, total: np.ndarray, survivors: int, expected: int
                      ) -> Reduced:
        """The round's aggregate delta from the unmasked sum of `survivors` clients.

        Without DP it is their unweighted mean. With distributed DP it is the noisy sum over
        q·N (DP-FedAvg's fixed denominator; `expected` is the number drawn), and the round is accounted as
        DP-FedAvg with multiplier z·sqrt(min(n, m)/m), n the survivors (all assumed honest):
        fewer than m clients lower the noise.
        """
        ddp = self.distributed_dp(expected)
        if ddp is None:
            return total / max(1, survivors), {"secagg_survivors": float(survivors)}, \
                f"secagg: unweighted mean of {survivors} masked updates"
        dp = self.dp
        assert dp is not None
        m = ddp.min_honest_clients
        z_eff = dp.noise_multiplier * math.sqrt(min(survivors, m) / m)
        eps = dp.accountant.step(noise_multiplier=z_eff, sample_rate=self.sample_rate)
        share_std = dp.noise_multiplier * dp.clip_norm / math.sqrt(m)
        metrics = {"secagg_survivors": float(survivors), "epsilon": eps,
                   "dp_clip": dp.clip_norm, "dp_noise_std": share_std * math.sqrt(survivors),
                   "dp_noise_multiplier": z_eff, "dp_sample_rate": self.sample_rate}
        denominator = self.expected_clients
        return total / denominator, metrics, \
            (f"secagg + distributed DP: noisy sum of {survivors} masked updates / "
             f"{denominator:g}, epsilon={eps:.4f}")

    def secagg_aggregator(self, r: int, rnd: ServerRound, template: NDArrays, expected: int
                          ) -> CollectingAggregator:
        """The round's result as an accumulator the strategy can apply: the unmasked sum
        reduced by `secagg_reduce`, or nothing (the model stays) when the round aborted."""
        n, rejected = len(rnd.cids), float(len(rnd.secagg.rejections))
        if rnd.result is None:
            acc = CollectingAggregator(template, _no_reduce)
            acc.metrics = {"secagg_aborted": 1.0, "secagg_survivors": 0.0,
                           "secagg_dropped": float(n - len(rnd.alive)),
                           "secagg_rejected": rejected}
            acc.reason = f"secagg aborted: {rnd.secagg.abort_reason or 'unfinished'}"
            return acc
        survivors = len(rnd.result.survivors)
        vec, metrics, reason = self.secagg_reduce(r, rnd.total(), survivors, expected)
        metrics = {**metrics, "secagg_dropped": float(n - survivors),
                   "secagg_rejected": rejected}
        return CollectingAggregator.reduced(template, survivors, vec, metrics, reason)

    def _secagg(self, r: int, expected: int) -> Reduce:
        """SecAgg+ of updates already collected in this process: the same client encoding,
        protocol and reduction as a round over the transport (`Server` runs those), with every
        party in one process. For tests and benchmarks of the arithmetic; the server of a
        federated task never calls it."""
        from plinth.fl.privacy.dp import ChaChaNoise, NumpyNoise
        from plinth.fl.privacy.secagg_driver import run_secagg_round
        from plinth.fl.privacy.secagg_round import noisy_vector

        def reduce(rows: np.ndarray, weights: np.ndarray) -> Reduced:
            n, d = rows.shape
            if n < 3:
                log.warning("round %d: SecAgg needs 3 updates, got %d; the model stays", r, n)
                return np.zeros(d), {"secagg_skipped": 1.0}, "too few updates for SecAgg"
            ddp = self.distributed_dp(expected)
            inputs = {i: noisy_vector(rows[i], ddp, NumpyNoise(np.random.default_rng(
                [self.seed, r, i, 0xDD])) if self.seeded else ChaChaNoise()) for i in range(n)}
            out = run_secagg_round(self.secagg_config(r, n, d), inputs)
            return self.secagg_reduce(r, out.total, len(out.result.survivors), expected)

        return reduce

    def charge_unreleased(self) -> Metrics:
        """With DP, a round that released no aggregate (an empty Poisson draw, every update
        failed, SecAgg aborted or skipped) is still charged: the accountant counts every
        round that was drawn, whatever came of it."""
        if self.dp is None:
            return {}
        eps = self.dp.accountant.step(noise_multiplier=self.dp.noise_multiplier,
                                      sample_rate=self.sample_rate)
        clip = self.dp.adaptive.clip_norm if self.dp.adaptive else self.dp.clip_norm
        return {"epsilon": eps, "dp_sample_rate": self.sample_rate, "dp_clip": clip}

    def end_round(self, r: int, acc: Any, chosen: list[str], failures: list[Failure]) -> Metrics:
        # the accumulator's own metrics come with aggregate_fit's
        metrics: Metrics = self.charge_unreleased() if acc is not None and acc.count == 0 \
            else {}
        if self.local_accountant is not None and self.local_spec is not None:
            # ε(δ) of one client that uploaded in every round so far, against the server itself
            metrics["local_epsilon"] = self.local_accountant.step(
                noise_multiplier=self.local_spec.noise_multiplier, sample_rate=1.0)
        if self.registry is not None and self.consent is not None:
            failed = {f.cid for f in failures}
            now = self.wall()
            for cid in chosen:
                if cid in failed:
                    continue
                try:
                    self.registry.record_participation(cid, self.consent.purpose,
                                                       task_id=self.task_id, round=r, now=now)
                except ValueError as e:  # consent revoked during the round
                    log.warning("round %d: %s", r, e)
        return metrics

    def close(self) -> None:
        if self.registry is not None:
            self.registry.close()
