"""`Safeguards`: what the app's `strategy.robust`, `privacy` and `consent` sections ask of a
round, composed from one part per job (robust.py, dp.py, consent.py, collecting.py).

The server asks three things in a synchronous round:

1. `start_round`: may the round run at all (DP: not past the ε budget; robust rules: not with
   fewer clients than the rule needs), and who is selected (consent: only clients with live
   consent; every exclusion and selection is audited);
2. `begin`: the round's accumulator: the collecting one for robust rules and central DP; None
   otherwise (the server folds the round in its own). A SecAgg+ round never holds an update: the server drives the
   protocol (`plinth.fl.privacy.secagg_round`) with `secagg_config` and `distributed_dp`, and
   `secagg_aggregator` turns the unmasked sum into the round's aggregate;
3. `end_round`: metrics for the round record (ε, clip, the rule's reason) and the consent log.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from plinth.fl.app import AppSpec, seeded_noise
from plinth.fl.messages import ClientInfo, Failure, Metrics, NDArrays
from plinth.fl.safeguards.collecting import CollectingAggregator, Reduce, Reduced, no_reduce
from plinth.fl.selection import select

if TYPE_CHECKING:
    from plinth.fl.privacy.secagg import SecAggConfig
    from plinth.fl.privacy.secagg_round import DistributedDP, ServerRound

log = logging.getLogger("plinth.fl.safeguards")


class Safeguards:
    def __init__(self, spec: AppSpec, *,
                 server_update: Callable[[NDArrays, int], np.ndarray] | None = None,
                 wall: Callable[[], float] = time.time, simulated: bool = False) -> None:
        self.seed = spec.seed
        self.secagg = spec.privacy.secagg
        self.robust = None
        if spec.strategy.robust is not None:
            from plinth.fl.safeguards.robust import RobustRound

            self.robust = RobustRound(spec.strategy.robust, server_update)
        self.privacy = None
        dp, local = spec.privacy.dp, spec.privacy.local_dp
        if dp is not None or local is not None:
            from plinth.fl.safeguards.dp import DPRound

            # seeded DP noise and a seeded client draw only in `plinth fl sim` (see app.Noise)
            seeded = dp is not None and seeded_noise(dp.noise, simulated=simulated)
            self.privacy = DPRound(dp, local, seed=spec.seed, seeded=seeded)
        self.consent = None
        if spec.consent is not None:
            from plinth.fl.safeguards.consent import ConsentHook

            self.consent = ConsentHook(spec, spec.consent, wall)

    # what the server, the CLI and the tests read
    @property
    def dp(self) -> Any:
        return None if self.privacy is None else self.privacy.dp

    @property
    def registry(self) -> Any:
        return None if self.consent is None else self.consent.registry

    @property
    def sample_rate(self) -> float:
        return 1.0 if self.privacy is None else self.privacy.sample_rate

    @property
    def expected_clients(self) -> float:
        return 1.0 if self.privacy is None else self.privacy.expected_clients

    @property
    def active(self) -> bool:
        return any(x is not None for x in (self.robust, self.privacy, self.secagg, self.consent))

    def restore(self, records: Sequence[Any]) -> None:
        """Replay the DP accounting of checkpointed rounds, so ε does not restart at zero."""
        if self.privacy is not None:
            self.privacy.restore(records)

    # -- the round ------------------------------------------------------------------------------

    def start_round(self, r: int, pool: list[ClientInfo], *, fraction: float,
                    min_clients: int, rng: np.random.Generator) -> tuple[list[str], str | None]:
        """The round's clients, or ``([], why)`` when the task must stop before the round.

        With consent only the clients with live consent are in the pool. Without DP,
        ⌈fraction·n⌉ of the n are drawn with `rng`. With DP each is drawn independently with
        probability q = `poisson_rate(...)` from a CSPRNG (the sampler the accountant assumes,
        and secret). The checks that may stop the task run before the draw.
        """
        ids = sorted(x.cid for x in pool)
        if self.consent is not None:
            live = set(self.consent.consenting(r, ids, min_clients))
            pool = [x for x in pool if x.cid in live]
        if self.dp is not None:
            from plinth.fl.privacy.sampling import poisson_rate, poisson_sample

            assert self.privacy is not None
            q = poisson_rate(fraction=fraction, min_clients=min_clients, pool_size=len(pool))
            why = self.admit(r, q * len(pool), len(pool))
            chosen = [] if why else poisson_sample([x.cid for x in pool], rate=q,
                                                   source=self.privacy.noise(r, 0x5E1))
        else:
            k = min(len(pool), max(min_clients, math.ceil(fraction * len(pool))))
            why = self.admit(r, k, len(pool))
            chosen = [] if why else select(pool, fraction=fraction, min_clients=min_clients,
                                           rng=rng)
        if why:
            return [], why
        if self.consent is not None:
            self.consent.selected(r, chosen)
        return chosen, None

    def refuses_update(self, cid: str) -> str | None:
        """Why an update from `cid` must not be used (consent revoked during the round)."""
        return None if self.consent is None else self.consent.refuses_update(cid)

    def admit(self, r: int, k: float, pool_size: int) -> str | None:
        """None if a round of `k` clients (with DP: q·N expected) drawn from `pool_size` may
        run; otherwise why the task stops before it (the robust rule, SecAgg, a budget)."""
        if self.robust is not None and (why := self.robust.too_few(r, k)):
            return why
        if self.secagg is not None and self.dp is None and k < 3:
            return f"privacy.secagg: needs at least 3 clients a round, round {r} selected {k}"
        return None if self.privacy is None else self.privacy.over_budget(k, pool_size)

    def begin(self, r: int, params: NDArrays, chosen: list[str]) -> CollectingAggregator | None:
        """The round's accumulator, collecting the updates of a model of `params`; None
        without a rule, central DP or SecAgg: the server's own (the tree too: consent and local
        DP act outside the fold)."""
        if self.robust is None and self.dp is None and self.secagg is None:
            return None
        if self.robust is not None:
            reduce = self.robust.reduce_for(r, params)
        elif self.dp is not None and self.secagg is None:
            assert self.privacy is not None
            reduce = self.privacy.reduce_for(r)
        else:  # SecAgg over collected updates, in one process: see _secagg
            reduce = self._secagg(r, len(chosen))
        return CollectingAggregator(params, reduce)

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
        """With privacy.dp.mode distributed: the noise share each client adds before masking."""
        if self.secagg is None or self.privacy is None:
            return None
        return self.privacy.distributed(expected)

    def secagg_reduce(self, r: int, total: np.ndarray, survivors: int, expected: int
                      ) -> Reduced:
        """The round's aggregate delta from the unmasked sum of `survivors` clients."""
        if self.privacy is None or self.distributed_dp(expected) is None:
            return total / max(1, survivors), {"secagg_survivors": float(survivors)}, \
                f"secagg: unweighted mean of {survivors} masked updates"
        return self.privacy.secagg_reduce(total, survivors, expected)

    def secagg_aggregator(self, r: int, rnd: ServerRound, template: NDArrays, expected: int
                          ) -> CollectingAggregator:
        """The round's result as an accumulator the strategy can apply: the unmasked sum
        reduced by `secagg_reduce`, or nothing (the model stays) when the round aborted."""
        n, rejected = len(rnd.cids), float(len(rnd.secagg.rejections))
        if rnd.result is None:
            acc = CollectingAggregator(template, no_reduce)
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
        protocol and reduction as a round over the transport, every party in one process.
        For tests and benchmarks of the arithmetic; a federated task's server never calls it."""
        from plinth.fl.privacy.dp import ChaChaNoise
        from plinth.fl.privacy.secagg_driver import run_secagg_round
        from plinth.fl.privacy.secagg_round import noisy_vector

        def reduce(rows: np.ndarray, weights: np.ndarray) -> Reduced:
            n, d = rows.shape
            if n < 3:
                log.warning("round %d: SecAgg needs 3 updates, got %d; the model stays", r, n)
                return np.zeros(d), {"secagg_skipped": 1.0}, "too few updates for SecAgg"
            ddp = self.distributed_dp(expected)
            inputs = {i: noisy_vector(rows[i], ddp, self.privacy.noise(r, i, 0xDD)
                                      if self.privacy is not None else ChaChaNoise())
                      for i in range(n)}
            out = run_secagg_round(self.secagg_config(r, n, d), inputs)
            return self.secagg_reduce(r, out.total, len(out.result.survivors), expected)

        return reduce

    def charge_unreleased(self) -> Metrics:
        return {} if self.privacy is None else self.privacy.charge_unreleased()

    def end_round(self, r: int, acc: Any, chosen: list[str], failures: list[Failure]) -> Metrics:
        # the accumulator's own metrics come with aggregate_fit's
        metrics: Metrics = self.charge_unreleased() if acc is not None and acc.count == 0 \
            else {}
        if self.privacy is not None:
            metrics |= self.privacy.local_step()
        if self.consent is not None:
            self.consent.participated(r, chosen, failures)
        return metrics

    def close(self) -> None:
        if self.consent is not None:
            self.consent.close()
