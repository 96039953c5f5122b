"""The triple sums of ADMM, attacked across iterations (found auditing issue 19).

Each site's contribution π_i·y_i is, in every iteration, the same public linear function of its
two secrets (π_i·w_i, π_i·λ_i,0) plus a term in the public z: the ρ schedule is in the config and
λ's update is deterministic. Every site receives every triple's sum (the leaders publish
them), so after t iterations it holds t·v/3 linear equations in 2v unknowns. Once they determine
a site's w (from 7 iterations on), fresh secret λ₀ and shares do not help: the attack below
needs no seed, only the sums, z and the config.

Measured (printed with -s), on the sums as they were published before the fix (the true S_g):
with the default cap anyone holding them recovers every one of 15 sites' models to about 1e-9,
and at 9 sites one site, with its own w and λ₀, recovers two of its partners'. The sums are now
masked with zero-sum pair masks (`consensus.PairMasks`), so a published sum is S_g + M_g; the
same attacks, given all the mask terms the attackers can compute, must do no better than chance.
"""

import numpy as np

from plinth.fl.admm.consensus import ADMMConfig, Site, decode, group_of, weights_from_counts
from plinth.fl.admm.kirkman import kirkman_triple_system

D = 16


def run_protocol(v: int, seed: int = 1):
    """The protocol's phase methods with each site's default (OS CSPRNG) randomness. Returns
    (w, pi, sites, published, true, zs): each iteration's triple sums as every site receives
    them (k, triple, uint64 words), the same sums unmasked (as published before the fix), and z."""
    config = ADMMConfig()
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(v, D))
    pi = weights_from_counts(rng.integers(10, 100, v).tolist())
    design = kirkman_triple_system(v)
    sites = [Site(i, w[i], float(pi[i]), config, trace=True) for i in range(v)]
    publics = {i: s.public_key() for i, s in enumerate(sites)}
    for s in sites:
        s.agree(publics)
    lam0 = np.stack([s.lam.copy() for s in sites])
    published, true, zs = [], [], []
    for k in range(config.num_iterations(v)):
        inbox: dict[int, list[np.ndarray]] = {i: [] for i in range(v)}
        for i, s in enumerate(sites):
            for p, r in s.shares(k, group_of(design, k, i)).items():
                inbox[p].append(r)
        sums = []
        for tri in design[k % len(design)]:
            sums.append(sum(sites[i].partial(inbox[i]) for i in tri))
            published.append((k, tri, sums[-1]))
            true.append((k, tri, sum((sites[i].sent_values[k] for i in tri),
                                     np.zeros(D, np.uint64))))
        for s in sites:
            s.finish(sums)
        zs.append(sites[0].z.copy())
    return w, pi, lam0, sites, published, true, zs


def stripped(sums, sites, colluders=()):
    """The sums decoded, less every mask term the `colluders` can compute: those of the pairs
    they are in. A pair (a member a, an outsider b) adds a's signed pair mask to the sum."""
    out = []
    for k, tri, raw in sums:
        known = np.zeros(D, np.uint64)
        for a in tri:
            for b in (b for b in range(len(sites)) if b not in tri):
                if a in colluders:
                    known += sites[a].masks.pair(b, k, D)
                elif b in colluders:
                    known -= sites[b].masks.pair(a, k, D)
        out.append((k, tri, decode(raw - known)))
    return out


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


def test_the_attack_recovers_every_model_from_the_unmasked_sums():
    """The attack is sound: on the sums as they were published before the masks, it recovers
    every model of 15 sites (and the masks cancel: z is the same)."""
    v = 15
    w, pi, _, _, _, true, zs = run_protocol(v)
    err = relative_errors(solve(v, pi, [(k, t, decode(s)) for k, t, s in true], zs), w)
    print(f"v={v}, unmasked sums: models recovered, relative error {err.max():.2g}")
    assert err.max() < 1e-6
    np.testing.assert_allclose(zs[-1], pi @ w, atol=1e-6)


def test_the_published_triple_sums_do_not_give_away_the_models():
    v = 15
    w, pi, _, sites, published, _, zs = run_protocol(v)
    err = relative_errors(solve(v, pi, stripped(published, sites), zs), w)
    print(f"v={v}: models from the published sums alone, relative error {err.min():.2g}")
    assert err.min() > 0.5  # chance: guessing 0 has relative error 1


def test_a_curious_site_does_not_learn_a_partners_model():
    """Site 0 strips every mask term of its own pairs and knows its own w and λ₀ (at 9 sites,
    unmasked, it recovered two partners' models exactly)."""
    v = 9
    w, pi, lam0, sites, published, true, zs = run_protocol(v)
    known = {0: w[0], v: lam0[0]}
    before = relative_errors(solve(v, pi, [(k, t, decode(s)) for k, t, s in true], zs, known), w)
    assert before[1:].min() < 1e-6  # the leak the masks close
    err = relative_errors(solve(v, pi, stripped(published, sites, (0,)), zs, known), w)[1:]
    print(f"v={v}: site 0's best recovery of another site's model, relative error "
          f"{err.min():.2g} (unmasked: {before[1:].min():.2g})")
    assert err.min() > 0.5


def test_two_colluding_members_of_a_triple_do_not_learn_the_third():
    """Site 0 and its first partner of iteration 0 collude. Together they subtract their own
    values and every mask term of their pairs from the triple's sum; the third member's mask
    stays on it. Unmasked, they read the third member's π·y off that sum in every iteration
    they share it, and solve for its model once the class repeats."""
    v = 9
    w, pi, lam0, sites, published, true, zs = run_protocol(v)
    _, a, third = sorted(kirkman_triple_system(v)[0][0])  # iteration 0's triple of site 0
    assert 0 in kirkman_triple_system(v)[0][0]
    known = {0: w[0], a: w[a], v: lam0[0], v + a: lam0[a]}
    before = relative_errors(solve(v, pi, [(k, t, decode(s)) for k, t, s in true], zs, known), w)
    err = relative_errors(solve(v, pi, stripped(published, sites, (0, a)), zs, known), w)
    print(f"v={v}: sites 0 and {a} on site {third}, relative error {err[third]:.2g} "
          f"(unmasked: {before[third]:.2g})")
    assert before[third] < 1e-6  # the collusion the masks defeat
    others = [i for i in range(v) if i not in (0, a)]
    assert err[others].min() > 0.5
