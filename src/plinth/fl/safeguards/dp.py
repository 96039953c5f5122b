"""The DP round: central DP-FedAvg, local DP's accounting, and distributed DP under SecAgg+.

It keeps what spans rounds (the accountants, the adaptive clip) and the round's Poisson rate
q and q·N, DP-FedAvg's fixed denominator. A round that released nothing is still charged:
the accountant counts every round that was drawn.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl.app import DPSpec, LocalDPSpec
from plinth.fl.messages import Metrics
from plinth.fl.safeguards.collecting import Reduce, Reduced

if TYPE_CHECKING:
    from collections.abc import Sequence

    from plinth.fl.privacy.secagg_round import DistributedDP


class DPRound:
    def __init__(self, dp: DPSpec | None, local: LocalDPSpec | None, *, seed: int,
                 seeded: bool) -> None:
        from plinth.fl.privacy.dp import AdaptiveClip, DPFedAvg, PrivacyAccountant

        self.spec, self.local_spec, self.seed, self.seeded = dp, local, seed, seeded
        self.sample_rate = 1.0  # the round's Poisson rate q ...
        self.expected_clients = 1.0  # ... and q·N
        self.dp = None
        if dp is not None:
            adaptive = None
            if dp.adaptive is not None:
                adaptive = AdaptiveClip(
                    clip_norm=dp.clip, target_quantile=dp.adaptive.target_quantile,
                    learning_rate=dp.adaptive.learning_rate,
                    count_noise_std=dp.adaptive.count_noise_std or dp.noise_multiplier)
            self.dp = DPFedAvg(noise_multiplier=dp.noise_multiplier, expected_clients=1.0,
                               clip_norm=dp.clip, adaptive=adaptive,
                               epsilon_budget=dp.epsilon_budget,
                               accountant=PrivacyAccountant(kind=dp.accountant, delta=dp.delta))
        # local DP: the clients noise their own uploads (client.py); the server only accounts
        self.local_accountant = None if local is None else \
            PrivacyAccountant(kind=local.accountant, delta=local.delta)

    def restore(self, records: Sequence[Any]) -> None:
        """Replay the accounting of checkpointed rounds, so ε does not restart at zero."""
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
                    self.dp.adaptive = replace(self.dp.adaptive, clip_norm=m["dp_next_clip"])

    def over_budget(self, k: float, pool_size: int) -> str | None:
        """Why a round of `k` expected clients out of `pool_size` would pass a budget, or None;
        with central DP it also sets the round's q and q·N."""
        from plinth.fl.privacy.dp import check_budget

        if self.dp is not None:
            self.sample_rate = k / max(1, pool_size)
            self.expected_clients = float(k)
            if self.dp.epsilon_budget is not None:
                d = check_budget(self.dp.accountant, epsilon_budget=self.dp.epsilon_budget,
                                 noise_multiplier=self.dp.noise_multiplier,
                                 sample_rate=self.sample_rate)
                if not d.allowed:
                    return f"privacy.dp.epsilon_budget: {d.reason}"
        local = self.local_spec
        if local is not None and local.epsilon_budget is not None:
            assert self.local_accountant is not None
            d = check_budget(self.local_accountant, epsilon_budget=local.epsilon_budget,
                             noise_multiplier=local.noise_multiplier, sample_rate=1.0)
            if not d.allowed:
                return f"privacy.local_dp.epsilon_budget: {d.reason}"
        return None

    def noise(self, *key: int) -> Any:
        """The noise source for `key` (round, ...): seeded only in `plinth fl sim`."""
        from plinth.fl.privacy.dp import ChaChaNoise, NumpyNoise

        return NumpyNoise(np.random.default_rng([self.seed, *key])) if self.seeded \
            else ChaChaNoise()

    def reduce_for(self, r: int) -> Reduce:
        dp = self.dp
        assert dp is not None
        noise = self.noise(r, 0xD9)

        def reduce(rows: np.ndarray, weights: np.ndarray) -> Reduced:
            # DP-FedAvg: every update counts the same (clipped to C), divided by the fixed q·N,
            # not the number drawn or the number that replied, so one client moves the sum by
            # at most C whatever the Poisson draw.
            dp.expected_clients = self.expected_clients
            clip = dp.adaptive.clip_norm if dp.adaptive else dp.clip_norm
            out = dp.aggregate(rows, sample_rate=self.sample_rate, noise=noise)
            if out is None:  # the budget was checked first; kept as a guard
                raise PlinthError(f"privacy.dp: {dp.stopped}")
            m = {"epsilon": dp.accountant.history[-1], "dp_clip": clip,
                 "dp_clipped": float(out.num_clipped), "dp_noise_std": out.noise_std,
                 "dp_sample_rate": self.sample_rate}
            if dp.adaptive is not None:
                m["dp_next_clip"] = dp.adaptive.clip_norm
            return out.mean, m, out.reason

        return reduce

    def distributed(self, expected: int) -> DistributedDP | None:
        """Under SecAgg+: the noise share each client adds before masking; m is
        min_honest_clients, by default the round's selected clients."""
        if self.dp is None or self.spec is None:
            return None
        from plinth.fl.privacy.secagg_round import DistributedDP

        return DistributedDP(self.dp.clip_norm, self.dp.noise_multiplier,
                             self.spec.min_honest_clients or expected)

    def secagg_reduce(self, total: np.ndarray, survivors: int, expected: int) -> Reduced:
        """The aggregate delta from the unmasked sum of `survivors` clients: their unweighted
        mean, or with distributed DP the noisy sum over q·N, accounted with multiplier
        z·sqrt(min(n, m)/m) (fewer than m honest clients lower the noise)."""
        ddp = self.distributed(expected)
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

    def charge_unreleased(self) -> Metrics:
        """A round that released no aggregate (an empty draw, every update failed, SecAgg
        aborted or skipped) is charged all the same."""
        if self.dp is None:
            return {}
        eps = self.dp.accountant.step(noise_multiplier=self.dp.noise_multiplier,
                                      sample_rate=self.sample_rate)
        clip = self.dp.adaptive.clip_norm if self.dp.adaptive else self.dp.clip_norm
        return {"epsilon": eps, "dp_sample_rate": self.sample_rate, "dp_clip": clip}

    def local_step(self) -> Metrics:
        """ε(δ) of one client that uploaded in every round so far, against the server."""
        if self.local_accountant is None or self.local_spec is None:
            return {}
        return {"local_epsilon": self.local_accountant.step(
            noise_multiplier=self.local_spec.noise_multiplier, sample_rate=1.0)}
