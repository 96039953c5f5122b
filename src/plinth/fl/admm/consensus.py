"""Decentralised weighted averaging by consensus ADMM over Kirkman triples (Jeon et al. 2020).

Every site i holds a model w_i and weight pi_i (sum pi_i = 1). Iteration k with penalty rho_k:

1. x_i <- (2 w_i - lambda_i + rho z) / (2 + rho)
2. y_i <- x_i + lambda_i / rho
3. z   <- sum_i pi_i y_i
4. lambda_i <- lambda_i + rho (x_i - z)

This is ADMM for min sum_i pi_i |x_i - w_i|^2 subject to x_i = z, so z -> sum_i pi_i w_i.
rho_k = rho0 * rho_decay^k; lambda_i starts Gaussian (std ``lambda_std``), so a single y_i says
nothing about w_i.

A site's secret randomness (lambda_0 and its additive shares) is its own: by default a ChaCha20
stream keyed from the OS CSPRNG (``ChaChaNoise``), never anything in the app config, which every
site holds. With a seeded stream a partner could regenerate both and read w_i off one partial
sum (tests/fl/test_admm_seed_replay.py runs that attack); only the in-process simulation
``run_admm(seed=...)`` uses seeded streams. Iteration k uses parallel class k mod (v-1)/2 of a
KTS(v), and at most 2 (v-1)/2 - 1 iterations run (the paper's cap).

How z is formed without revealing any y_i (our reading of the paper's group protocol, with
the triple sums masked):

0. once per run, every pair of sites agrees a key (X25519 from the OS CSPRNG, HKDF, as SecAgg+
   does): ``PairMasks``. In iteration k site i adds m_i = sum_{j != i} +-PRG(k_ij, k) to its
   value; the lower id of a pair adds the pair's mask and the higher subtracts it, so the masks
   of all sites cancel in z, but not in any triple's sum;
a. each site encodes pi_i y_i + m_i in fixed point mod 2^64 and splits it into three additive
   shares, two uniformly random; it keeps one and sends one to each triple partner;
b. each site adds what it holds and sends that partial sum to its partners: each partial is
   uniform on its own, and together they give only the triple's masked sum S_g + M_g;
c. the lowest-id member of each triple publishes it to the other sites; z = sum_g (S_g + M_g)
   = sum_g S_g, exactly (mod 2^64).

Without the masks every site received every S_g, and y_i is the same public linear function of
(w_i, lambda_i,0) at every site, so from 7 iterations on the S_g determined the models
(tests/fl/test_admm_triple_sums.py attacks that). With them a published sum is uniform to
anyone but the whole federation: M_g holds the masks of pairs between a member and an outsider,
and no site knows the keys of pairs it is not in, so neither a curious site nor two colluding
members of a triple can strip it (a coalition would need a key of every member-outsider pair).
Only z is public. Every site must take part to the end, as before: a site that leaves mid-run
leaves its masks in z, and the run fails rather than publish a wrong average. Fixed-point scale 2^32 gives ~2e-10
absolute resolution and values up to 2^31 / (number of sites) in magnitude.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from plinth.fl.admm.kirkman import Design, Triple, kirkman_triple_system
from plinth.fl.privacy.dp import ChaChaNoise, NoiseSource, NumpyNoise
from plinth.fl.privacy.masking import derive_key, expand_mask, pair_info

SCALE = float(1 << 32)


def iteration_cap(v: int) -> int:
    return 2 * ((v - 1) // 2) - 1


def encode(x: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(x, dtype=np.float64) * SCALE).astype(np.int64).view(np.uint64)


def decode(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.uint64).view(np.int64).astype(np.float64) / SCALE


@dataclass(frozen=True, slots=True)
class ADMMConfig:
    rho0: float = 0.5
    rho_decay: float = 0.5
    lambda_std: float = 1.0
    iterations: int | None = None  # None: the cap 2 (v-1)/2 - 1

    def rho(self, k: int) -> float:
        return self.rho0 * self.rho_decay**k

    def num_iterations(self, v: int) -> int:
        cap = iteration_cap(v)
        n = cap if self.iterations is None else self.iterations
        if not 1 <= n <= cap:
            raise ValueError(
                f"iterations must be in [1, {cap}] for {v} sites (2 (v-1)/2 - 1), got {n}"
            )
        return n


class PairMasks:
    """A site's zero-sum masks, agreed pairwise with every other site (step 0 above)."""

    __slots__ = ("_keys", "_sk", "me")

    def __init__(self, me: int) -> None:
        self.me = me
        self._sk = X25519PrivateKey.generate()  # the OS CSPRNG, fresh for each run
        self._keys: dict[int, bytes] = {}

    def public(self) -> np.ndarray:
        """The public key, as the array a site sends every other site."""
        return np.frombuffer(self._sk.public_key().public_bytes_raw(), np.uint8).copy()

    def agree(self, publics: Mapping[int, np.ndarray]) -> None:
        """One shared secret with each other site, from its public key."""
        for j, pk in publics.items():
            if j != self.me:
                peer = X25519PublicKey.from_public_bytes(np.asarray(pk, np.uint8).tobytes())
                self._keys[j] = self._sk.exchange(peer)

    @property
    def peers(self) -> list[int]:
        return sorted(self._keys)

    def pair(self, j: int, k: int, n: int) -> np.ndarray:
        """The mask of pair (me, j) in iteration k, as `me` applies it (+ if the lower id)."""
        m = expand_mask(derive_key(self._keys[j], info=pair_info(k, self.me, j)), 2 * n)
        m = m.view(np.uint64)
        return m if self.me < j else np.zeros_like(m) - m

    def mask(self, k: int, n: int) -> np.ndarray:
        """m_i for iteration k: the sum of this site's pair masks (mod 2^64)."""
        if not self._keys:
            raise RuntimeError(f"site {self.me}: no pair keys agreed; call agree() first")
        total = np.zeros(n, np.uint64)
        for j in self._keys:
            total += self.pair(j, k, n)
        return total


def group_of(design: Design, k: int, site: int) -> Triple:
    cls = design[k % len(design)]
    return next(t for t in cls if site in t)


@dataclass(slots=True)
class Site:
    """One site's ADMM state; the three phase methods are the whole protocol (no I/O inside)."""

    site_id: int
    w: np.ndarray
    pi: float
    config: ADMMConfig
    rng: NoiseSource = field(default_factory=ChaChaNoise)  # secret: see the module docstring
    trace: bool = False  # keep each iteration's encoded pi_i y_i in sent_values (for audits)
    sent_values: list[np.ndarray] = field(default_factory=list)
    masks: PairMasks = field(init=False)
    lam: np.ndarray = field(init=False)
    z: np.ndarray = field(init=False)
    _x: np.ndarray | None = None
    _kept: np.ndarray | None = None
    _rho: float = 0.0

    def __post_init__(self) -> None:
        self.w = np.asarray(self.w, dtype=np.float64)
        self.lam = self.rng.normal(self.config.lambda_std, self.w.shape)
        self.z = np.zeros_like(self.w)
        self.masks = PairMasks(self.site_id)

    def public_key(self) -> np.ndarray:
        """Phase 0: what this site sends every other site once, before iteration 0."""
        return self.masks.public()

    def agree(self, publics: Mapping[int, np.ndarray]) -> None:
        """Phase 0: the pair keys, from every other site's public key."""
        self.masks.agree(publics)

    def shares(self, k: int, group: Triple) -> dict[int, np.ndarray]:
        """Phase a: ADMM steps 1-2, then additive shares of pi_i y_i + m_i for the two
        partners."""
        rho = self.config.rho(k)
        self._rho = rho
        self._x = (2.0 * self.w - self.lam + rho * self.z) / (2.0 + rho)
        y = self._x + self.lam / rho
        value = encode(self.pi * y)
        partners = [s for s in group if s != self.site_id]
        out = {p: self.rng.words(value.shape) for p in partners}
        if self.trace:
            self.sent_values.append(value.copy())
        kept = value + self.masks.mask(k, value.size).reshape(value.shape)
        for r in out.values():
            kept -= r
        self._kept = kept
        return out

    def partial(self, received: Sequence[np.ndarray]) -> np.ndarray:
        """Phase b: the sum of the kept share and the two received ones (uniform on its own)."""
        total = self._kept.copy()
        for r in received:
            total += r
        self._kept = None
        return total

    def finish(self, group_sums: Sequence[np.ndarray]) -> np.ndarray:
        """Phase c: z from all triples' sums (ADMM step 3), then the dual update (step 4)."""
        acc = np.zeros(self.w.shape, dtype=np.uint64)
        for s in group_sums:
            acc += s
        self.z = decode(acc)
        self.lam = self.lam + self._rho * (self._x - self.z)
        return self.z


@dataclass(slots=True)
class ADMMReport:
    z: np.ndarray
    exact: np.ndarray
    errors: list[float]  # max |z_k - exact| / max(|exact|, 1e-12) after each iteration
    iterations: int


def weights_from_counts(num_examples: Sequence[int]) -> np.ndarray:
    n = np.asarray(num_examples, dtype=np.float64)
    if n.ndim != 1 or np.any(n <= 0) or not np.all(np.isfinite(n)):
        raise ValueError(f"num_examples must be positive finite numbers, got {num_examples}")
    return n / n.sum()


def run_admm(
    models: np.ndarray,
    num_examples: Sequence[int],
    *,
    config: ADMMConfig = ADMMConfig(),
    seed: int = 0,
    design: Design | None = None,
) -> ADMMReport:
    """In-process simulation of the protocol: each site is a ``Site`` with a stream seeded from
    ``seed`` (reproducible, so not secret); the driver only carries messages."""
    w = np.asarray(models, dtype=np.float64)
    v = w.shape[0]
    pi = weights_from_counts(num_examples)
    design = kirkman_triple_system(v) if design is None else design
    iters = config.num_iterations(v)
    seeds = np.random.SeedSequence(seed).spawn(v)
    sites = [Site(i, w[i], float(pi[i]), config, NumpyNoise(np.random.default_rng(seeds[i])))
             for i in range(v)]
    publics = {i: s.public_key() for i, s in enumerate(sites)}
    for s in sites:
        s.agree(publics)  # the pair keys are not seeded: the masks cancel in z exactly
    exact = pi @ w
    errors = []
    for k in range(iters):
        cls = design[k % len(design)]
        inbox: dict[int, list[np.ndarray]] = {i: [] for i in range(v)}
        for i, s in enumerate(sites):
            for p, r in s.shares(k, group_of(design, k, i)).items():
                inbox[p].append(r)
        group_sums = []
        for tri in cls:
            partials = [sites[i].partial(inbox[i]) for i in tri]
            total = partials[0] + partials[1] + partials[2]
            group_sums.append(total)
        for s in sites:
            s.finish(group_sums)
        z = sites[0].z
        errors.append(float(np.max(np.abs(z - exact)) / max(float(np.max(np.abs(exact))), 1e-12)))
    return ADMMReport(sites[0].z.copy(), exact, errors, iters)
