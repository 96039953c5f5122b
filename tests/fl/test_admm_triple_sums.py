"""The published triple sums of ADMM, attacked across iterations (found auditing issue 19).

Each site's contribution π_i·y_i is, in every iteration, the same public linear function of its
two secrets (π_i·w_i, π_i·λ_i,0) plus a term in the public z: the ρ schedule is in the config and
λ's update is deterministic. Every site receives every triple sum S_g (the leaders publish
them), so after t iterations it holds t·v/3 linear equations in 2v unknowns. Once they determine
a site's w (from 7 iterations on), fresh secret λ₀ and shares do not help: the attack below
needs no seed, only the sums, z and the config.

Measured (printed with -s): with the default cap, anyone holding the sums recovers every one
of 15 sites' models to about 1e-9; at 9 sites one site, with its own w and λ₀, recovers two of
its partners'. The tests attack and assert that the attack fails; they are strict xfails
until the sums are hidden (docs/fl_privacy.md, threat model, ADMM row), so fixing the
protocol turns them into failures that ask for the markers to go.
"""

import numpy as np
import pytest

from plinth.fl.admm.consensus import ADMMConfig, Site, decode, group_of, weights_from_counts
from plinth.fl.admm.kirkman import kirkman_triple_system

D = 16


def run_protocol(v: int, seed: int = 1):
    """The protocol's phase methods with each site's default (OS CSPRNG) randomness; what every
    site receives: each iteration's triple sums, and z. Returns (w, pi, site 0's λ₀, sums, zs)."""
    config = ADMMConfig()
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(v, D))
    pi = weights_from_counts(rng.integers(10, 100, v).tolist())
    design = kirkman_triple_system(v)
    sites = [Site(i, w[i], float(pi[i]), config) for i in range(v)]
    lam0 = sites[0].lam.copy()
    sums, zs = [], []
    for k in range(config.num_iterations(v)):
        inbox: dict[int, list[np.ndarray]] = {i: [] for i in range(v)}
        for i, s in enumerate(sites):
            for p, r in s.shares(k, group_of(design, k, i)).items():
                inbox[p].append(r)
        published = []
        for tri in design[k % len(design)]:
            published.append(sum(sites[i].partial(inbox[i]) for i in tri))
            sums.append((k, tri, decode(published[-1])))
        for s in sites:
            s.finish(published)
        zs.append(sites[0].z.copy())
    return w, pi, lam0, sums, zs


def solve(v: int, pi: np.ndarray, sums, zs, known: dict[int, np.ndarray] | None = None):
    """Least squares for every (w_i, λ_i,0) from the sums; `known`: column -> value the attacker
    holds (a site's own w and λ₀). The per-site coefficients come from the config alone."""
    config = ADMMConfig()
    cw, cl, cc, z, coef = 0.0, 1.0, np.zeros(D), np.zeros(D), []
    for k in range(len(zs)):  # λ_k = cw·w + cl·λ₀ + cc, the same for every site
        rho = config.rho(k)
        xw, xl, xc = (2 - cw) / (2 + rho), -cl / (2 + rho), (-cc + rho * z) / (2 + rho)
        coef.append((xw + cw / rho, xl + cl / rho, xc + cc / rho))  # y_k's coefficients
        z = zs[k]
        cw, cl, cc = cw + rho * xw, cl + rho * xl, cc + rho * (xc - z)
    rows, rhs = [], []
    for k, tri, s in sums:
        a, b, c = coef[k]
        row = np.zeros(2 * v)
        for i in tri:
            row[i], row[v + i] = a * pi[i], b * pi[i]
        rows.append(row)
        rhs.append(s - c * sum(pi[i] for i in tri))
    for col, value in (known or {}).items():
        row = np.zeros(2 * v)
        row[col] = 1e6
        rows.append(row)
        rhs.append(1e6 * value)
    sol, *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    return sol[:v]


def relative_errors(guess: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.max(np.abs(guess - w), axis=1) / np.max(np.abs(w), axis=1)


@pytest.mark.xfail(strict=True, reason="known leak: the triple sums determine every model of 15 "
                   "sites at the default cap (docs/fl_privacy.md, threat model)")
def test_the_published_triple_sums_do_not_give_away_the_models():
    v = 15
    w, pi, _, sums, zs = run_protocol(v)
    err = relative_errors(solve(v, pi, sums, zs), w)
    print(f"v={v}: models recovered from the triple sums alone, relative error "
          f"{err.min():.2g}..{err.max():.2g}")
    assert err.min() > 0.5  # chance: guessing 0 has relative error 1


@pytest.mark.xfail(strict=True, reason="known leak: at 9 sites a site recovers two partners' "
                   "models from the sums and its own values (docs/fl_privacy.md, threat model)")
def test_a_curious_site_does_not_learn_a_partners_model():
    v = 9
    w, pi, lam0, sums, zs = run_protocol(v)
    err = relative_errors(solve(v, pi, sums, zs, {0: w[0], v: lam0}), w)[1:]
    print(f"v={v}: site 0's best recovery of another site's model, relative error "
          f"{err.min():.2g} (sites {(np.flatnonzero(err < 1e-6) + 1).tolist()})")
    assert err.min() > 0.5


def test_the_sums_of_6_iterations_leave_the_models_undetermined():
    """The same attack on the first 6 iterations: fewer equations than secrets, so no model
    comes out exact (it pins where the leak starts). The least-squares guess is still within a
    few per cent of some models (printed), so 6 iterations are not private either."""
    v = 15
    w, pi, lam0, sums, zs = run_protocol(v)
    six = [s for s in sums if s[0] < 6]
    err = relative_errors(solve(v, pi, six, zs[:6]), w)
    mine = relative_errors(solve(v, pi, six, zs[:6], {0: w[0], v: lam0}), w)[1:]
    print(f"v={v}, 6 iterations: best relative error {err.min():.2g} (anyone), "
          f"{mine.min():.2g} (site 0)")
    assert min(err.min(), mine.min()) > 1e-3  # exact recovery is ~1e-9 from 7 iterations on
