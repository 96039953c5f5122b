"""Client sampling for DP-FedAvg: Poisson sampling, the sampler the accountant assumes.

User-level DP-FedAvg (McMahan et al., ICLR 2018, Algorithm 1) selects each user independently
with probability q and divides the noisy sum by the fixed q·N, so one user changes the sum by at
most the clip whatever the draw. Its privacy analysis is the sampled Gaussian mechanism, which is
dp-accounting's ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under add/remove-one
neighbours. A fixed-size sample without replacement would need
``SampledWithoutReplacementDpEvent``, which dp-accounting's RDP accountant supports only for
replace-one neighbours (about twice the sensitivity) and its PLD accountant not at all; so when
DP is on Plinth draws clients by Poisson sampling and accounts exactly that
(``plinth.fl.privacy.dp.round_event``).

Amplification by sampling also needs the draw to be secret from whoever sees the released
model: the uniforms come from a CSPRNG (``ChaChaNoise`` keyed by the OS) except in
``plinth fl sim`` with seeded noise, where everything is a reproducible simulation anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from plinth.fl.privacy.dp import NoiseSource


def poisson_rate(*, fraction: float, min_clients: int, pool_size: int) -> float:
    """The inclusion probability q: `fraction`, raised so that q·N is at least `min_clients`."""
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    return min(1.0, max(fraction, min_clients / pool_size))


def poisson_sample(ids: Sequence[str], *, rate: float, source: NoiseSource) -> list[str]:
    """Each id independently with probability `rate` (uniforms from `source`), in id order."""
    if not 0 < rate <= 1:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    ids = sorted(ids)
    u = (source.words(len(ids)) >> np.uint64(11)).astype(np.float64) / 2.0**53  # [0, 1)
    return [c for c, x in zip(ids, u, strict=True) if x < rate]

