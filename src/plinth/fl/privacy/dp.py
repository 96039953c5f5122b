"""Differential privacy for federated learning: DP-FedAvg, adaptive clipping, local and distributed DP, accounting.

Client-level central DP (McMahan et al., ICLR 2018, "DP-FedAvg"): every client update is clipped
to L2 norm ``clip_norm``; the server adds Gaussian noise of std ``noise_multiplier * clip_norm`` to
the *sum* and divides by a fixed ``expected_clients`` (so one client's presence changes the sum by
at most ``clip_norm``). Each round is a (Poisson-subsampled) Gaussian mechanism with noise
multiplier z and sample rate q; :class:`PrivacyAccountant` composes the rounds with Google's
``dp-accounting`` (RDP or PLD) and reports epsilon(delta) after each round.

Adaptive clipping (Andrew et al., NeurIPS 2021): clients also report the bit ``norm <= C``; the
server forms a noisy fraction and moves ``C`` geometrically toward the target quantile. The count
noise ``sigma_b`` costs privacy, so the update noise multiplier is raised to
``z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2``; the pair then costs exactly as one Gaussian mechanism
with multiplier z, which is what you pass to the accountant.

Randomness comes from a ``NoiseSource``: :class:`NumpyNoise` (a seeded ``numpy.random.Generator``,
reproducible, for simulation) or :class:`ChaChaNoise` (ChaCha20 keystream keyed by a 32-byte
secret, a CSPRNG, for deployments where the noise must not be predictable).
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import dp_accounting
import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from plinth.core.registry import Registry

log = logging.getLogger("plinth.fl.privacy.dp")


def _rdp_order_dropped(record: logging.LogRecord) -> bool:
    """False for dp-accounting's "failed to converge" warning: the RDP accountant then leaves
    that order out of the minimum over orders, so epsilon stays a valid (slightly looser)
    bound, but it logs one line per order per call: hundreds in a DP run."""
    return "failed to converge" not in str(record.msg)


logging.getLogger("absl").addFilter(_rdp_order_dropped)


class NoiseSource(Protocol):
    def normal(self, std: float, size: int | tuple[int, ...]) -> np.ndarray: ...

    def words(self, size: int | tuple[int, ...]) -> np.ndarray: ...  # uniform uint64


def _shape(size: int | tuple[int, ...]) -> tuple[int, ...]:
    return (size,) if isinstance(size, int) else tuple(size)


@dataclass(slots=True)
class NumpyNoise:
    """Gaussian noise from a seeded numpy Generator (reproducible; not cryptographically secure)."""

    rng: np.random.Generator

    def normal(self, std: float, size: int | tuple[int, ...]) -> np.ndarray:
        return self.rng.normal(0.0, std, size)

    def words(self, size: int | tuple[int, ...]) -> np.ndarray:
        return self.rng.integers(0, np.iinfo(np.uint64).max, size=_shape(size),
                                 dtype=np.uint64, endpoint=True)


@dataclass(slots=True)
class ChaChaNoise:
    """Gaussian noise (Box-Muller over 53-bit uniforms) and uniform words from a ChaCha20
    keystream under a 32-byte key, by default from the OS CSPRNG: secret and unpredictable."""

    key: bytes = field(default_factory=lambda: os.urandom(32))
    _calls: int = 0

    def __post_init__(self) -> None:
        if len(self.key) != 32:
            raise ValueError(f"ChaChaNoise key must be 32 bytes, got {len(self.key)}")

    def _stream(self, nbytes: int) -> bytes:
        # Block counter 0, a fresh 96-bit nonce per call: the stream is never reused.
        nonce = bytes(4) + self._calls.to_bytes(12, "little")
        self._calls += 1
        return Cipher(algorithms.ChaCha20(self.key, nonce), mode=None).encryptor().update(
            bytes(nbytes))

    def words(self, size: int | tuple[int, ...]) -> np.ndarray:
        shape = _shape(size)
        count = int(np.prod(shape))
        return np.frombuffer(self._stream(8 * count), dtype="<u8").astype(np.uint64).reshape(
            shape)

    def normal(self, std: float, size: int | tuple[int, ...]) -> np.ndarray:
        shape = _shape(size)
        count = int(np.prod(shape))
        words = self.words(2 * count).reshape(2, count) >> np.uint64(11)
        u1 = (words[0].astype(np.float64) + 1.0) / 2.0**53  # (0, 1]
        u2 = words[1].astype(np.float64) / 2.0**53
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
        return (std * z).reshape(shape)


def clip_updates(updates: np.ndarray, clip_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """Scale each row of ``updates`` (n, d) to L2 norm at most ``clip_norm``; return (clipped, norms)."""
    if clip_norm <= 0:
        raise ValueError(f"clip_norm must be positive, got {clip_norm}")
    u = np.atleast_2d(np.asarray(updates, dtype=np.float64))
    if not np.all(np.isfinite(u)):
        raise ValueError("updates contain NaN or inf; reject them before clipping")
    norms = np.linalg.norm(u, axis=1)
    factor = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
    return u * factor[:, None], norms


@dataclass(frozen=True, slots=True)
class DPAggregate:
    mean: np.ndarray
    noise_std: float  # std of the noise added to the sum
    num_clipped: int
    reason: str


def dp_fedavg(
    updates: np.ndarray,
    *,
    clip_norm: float,
    noise_multiplier: float,
    expected_clients: float,
    noise: NoiseSource,
) -> DPAggregate:
    """DP-FedAvg server step: clip, sum, add N(0, (z C)^2), divide by the fixed expected count."""
    if expected_clients <= 0 or noise_multiplier < 0:
        raise ValueError(
            f"need expected_clients > 0 and noise_multiplier >= 0, got {expected_clients}, {noise_multiplier}"
        )
    clipped, norms = clip_updates(updates, clip_norm)
    std = noise_multiplier * clip_norm
    total = clipped.sum(axis=0) + noise.normal(std, clipped.shape[1])
    n_clip = int(np.sum(norms > clip_norm))
    return DPAggregate(
        total / expected_clients,
        std,
        n_clip,
        f"{len(norms)} updates, {n_clip} clipped to {clip_norm:g}, noise std {std:g} on the sum",
    )


@dataclass(frozen=True, slots=True)
class AdaptiveClip:
    """State of the private quantile estimate of the update norm (Andrew et al. 2021)."""

    clip_norm: float = 0.1
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_noise_std: float = 1.0  # std of the noise on the clipped-count sum (sigma_b * m)

    def update_noise_multiplier(self, noise_multiplier: float) -> float:
        """Update-noise multiplier so that update + count releases cost exactly ``noise_multiplier``.

        The count sum has sensitivity 1/2 when bits are centred to +-1/2, hence the factor 2.
        The paper suggests ``count_noise_std`` about expected_clients / 20.
        """
        sigma_b = self.count_noise_std
        inner = noise_multiplier**-2 - (2.0 * sigma_b) ** -2
        if inner <= 0:
            raise ValueError(
                f"count_noise_std {self.count_noise_std} too small for noise_multiplier {noise_multiplier}: "
                f"need sigma_b > z/2 (sigma_b = {sigma_b:g})"
            )
        return inner**-0.5

    def step(
        self, norms: np.ndarray, *, expected_clients: float, noise: NoiseSource
    ) -> AdaptiveClip:
        """Geometric update C <- C * exp(-eta (b_noisy - gamma)) from the clients' norms."""
        below = float(np.sum(np.asarray(norms) <= self.clip_norm))
        frac = (below + float(noise.normal(self.count_noise_std, 1)[0])) / expected_clients
        new = self.clip_norm * math.exp(-self.learning_rate * (frac - self.target_quantile))
        return replace(self, clip_norm=new)


def local_dp(
    update: np.ndarray, *, clip_norm: float, noise_multiplier: float, noise: NoiseSource
) -> np.ndarray:
    """Local DP: the client clips and adds N(0, (z C)^2) itself; the server is not trusted at all.

    Each upload alone is a Gaussian mechanism with multiplier z per round for that client's update.
    """
    clipped, _ = clip_updates(update, clip_norm)
    return clipped[0] + noise.normal(noise_multiplier * clip_norm, clipped.shape[1])


def distributed_noise_share(
    update: np.ndarray,
    *,
    clip_norm: float,
    noise_multiplier: float,
    min_honest_clients: int,
    noise: NoiseSource,
) -> np.ndarray:
    """Distributed DP with SecAgg: the client adds its share N(0, (z C)^2 / m) of the central noise.

    Guarantee: if SecAgg reveals only the sum and at least ``m = min_honest_clients`` clients in
    the round add their share honestly, the sum carries Gaussian noise of variance at least
    (z C)^2, so the server's view is (epsilon, delta)-DP with the same accounting as central
    DP-FedAvg with multiplier z. If fewer than m honest clients survive (dropouts, colluders
    that omit their noise) the guarantee degrades to multiplier z * sqrt(honest / m); choose m
    as the number of surviving honest clients you are willing to assume. Not covered: the
    rounding of SecAgg's fixed-point encoding (up to n / (2 scale) per coordinate, treated as
    post-processing of each client's already-noised value), and a server that breaks SecAgg.
    """
    if min_honest_clients < 1:
        raise ValueError(f"min_honest_clients must be >= 1, got {min_honest_clients}")
    clipped, _ = clip_updates(update, clip_norm)
    std = noise_multiplier * clip_norm / math.sqrt(min_honest_clients)
    return clipped[0] + noise.normal(std, clipped.shape[1])


# ---- accounting -----------------------------------------------------------------------------


def round_event(
    *, noise_multiplier: float, sample_rate: float, count: int = 1
) -> dp_accounting.DpEvent:
    """The DpEvent of ``count`` rounds of the Gaussian mechanism on a Poisson sample of rate
    ``sample_rate`` (the sampler the server runs with DP on: plinth.fl.privacy.sampling)."""
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if noise_multiplier <= 0:
        raise ValueError(
            f"noise_multiplier must be positive for accounting, got {noise_multiplier}"
        )
    ev: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(noise_multiplier)
    if sample_rate < 1:
        ev = dp_accounting.PoissonSampledDpEvent(sample_rate, ev)
    return dp_accounting.SelfComposedDpEvent(ev, count)


# `PrivacyAccountant(kind=...)`: the dp_accounting accountant that composes the rounds.
ACCOUNTANTS: Registry[Callable[[], dp_accounting.PrivacyAccountant]] = Registry("accountant")
ACCOUNTANTS.add("rdp", "dp_accounting.rdp:RdpAccountant")
ACCOUNTANTS.add("pld", "dp_accounting.pld:PLDAccountant", value_discretization_interval=1e-3)


@dataclass(slots=True)
class PrivacyAccountant:
    """Composes DP-FedAvg rounds; ``epsilon()`` is epsilon(delta) after the rounds so far."""

    kind: str = "rdp"
    delta: float = 1e-5
    rounds: list[tuple[float, float]] = field(
        default_factory=list
    )  # (noise_multiplier, sample_rate)
    history: list[float] = field(default_factory=list)  # epsilon after each round
    events: list[dp_accounting.DpEvent] = field(default_factory=list)  # what was composed

    _acc: dp_accounting.PrivacyAccountant | None = None

    def __post_init__(self) -> None:
        self._acc = ACCOUNTANTS.make(self.kind)
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")

    def epsilon(self) -> float:
        return float(self._acc.get_epsilon(self.delta)) if self.rounds else 0.0

    def epsilon_after_next(self, *, noise_multiplier: float, sample_rate: float) -> float:
        """Epsilon if one more round ran; the live accountant is left untouched."""
        trial = copy.deepcopy(self._acc)
        trial.compose(round_event(noise_multiplier=noise_multiplier, sample_rate=sample_rate))
        return float(trial.get_epsilon(self.delta))

    def step(self, *, noise_multiplier: float, sample_rate: float) -> float:
        """Record one round and return epsilon(delta) after it."""
        event = round_event(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
        self._acc.compose(event)
        self.events.append(event)
        self.rounds.append((noise_multiplier, sample_rate))
        eps = self.epsilon()
        # Composition never lowers epsilon; guard against numerical jitter of the optimiser anyway.
        eps = max(eps, self.history[-1]) if self.history else eps
        self.history.append(eps)
        log.info(
            "DP round %d: epsilon=%.4f at delta=%g (%s)",
            len(self.rounds),
            eps,
            self.delta,
            self.kind,
        )
        return eps


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    allowed: bool
    epsilon_now: float
    epsilon_next: float
    reason: str


def check_budget(
    accountant: PrivacyAccountant,
    *,
    epsilon_budget: float,
    noise_multiplier: float,
    sample_rate: float,
) -> BudgetDecision:
    """May the next round run without epsilon(delta) exceeding ``epsilon_budget``? Says why."""
    now = accountant.history[-1] if accountant.history else 0.0
    nxt = accountant.epsilon_after_next(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
    if nxt > epsilon_budget:
        reason = (
            f"stop: round {len(accountant.rounds) + 1} would raise epsilon from {now:.4f} to {nxt:.4f} "
            f"> budget {epsilon_budget:g} at delta={accountant.delta:g}"
        )
        log.warning(reason)
        return BudgetDecision(False, now, nxt, reason)
    return BudgetDecision(
        True,
        now,
        nxt,
        f"round {len(accountant.rounds) + 1} keeps epsilon at {nxt:.4f} <= {epsilon_budget:g}",
    )


@dataclass(slots=True)
class DPFedAvg:
    """One object a strategy can hold: clip, noise, adapt the clip, account, and enforce a budget.

    ``aggregate`` returns None (and records why in ``stopped``) when the round would exceed the
    budget; nothing is released in that case.
    """

    noise_multiplier: float
    expected_clients: float
    clip_norm: float = 1.0
    adaptive: AdaptiveClip | None = None
    epsilon_budget: float | None = None
    accountant: PrivacyAccountant = field(default_factory=PrivacyAccountant)
    stopped: str | None = None

    def aggregate(
        self, updates: np.ndarray, *, sample_rate: float, noise: NoiseSource
    ) -> DPAggregate | None:
        if self.stopped:
            return None
        if self.epsilon_budget is not None:
            d = check_budget(
                self.accountant,
                epsilon_budget=self.epsilon_budget,
                noise_multiplier=self.noise_multiplier,
                sample_rate=sample_rate,
            )
            if not d.allowed:
                self.stopped = d.reason
                return None
        clip = self.adaptive.clip_norm if self.adaptive else self.clip_norm
        z = (
            self.adaptive.update_noise_multiplier(self.noise_multiplier)
            if self.adaptive
            else self.noise_multiplier
        )
        out = dp_fedavg(
            updates,
            clip_norm=clip,
            noise_multiplier=z,
            expected_clients=self.expected_clients,
            noise=noise,
        )
        if self.adaptive:
            _, norms = clip_updates(updates, clip)
            self.adaptive = self.adaptive.step(
                norms, expected_clients=self.expected_clients, noise=noise
            )
        eps = self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=sample_rate)
        return replace(
            out, reason=f"{out.reason}; epsilon={eps:.4f} at delta={self.accountant.delta:g}"
        )
