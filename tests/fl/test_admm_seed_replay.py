"""The seed-replay attack on ADMM (issue 19, finding 1), run against real site processes.

A site that holds the app YAML knows every seed in it. Before the fix each site's λ₀ and its
"uniform" additive shares came from a generator seeded by that config, so a site could
regenerate its triple partners' streams, strip the shares off the partial sum a partner sent
it, and read off π_j·y_j, hence w_j, in the first iteration (to about 1e-9). The attack below
uses exactly what such a site has: the config (every seed it could hold, the public weights
and Kirkman design) and the messages it received. It must now do no better than chance.
"""

from pathlib import Path

import numpy as np

from plinth.fl.admm.consensus import ADMMConfig, decode, group_of
from plinth.fl.admm.kirkman import kirkman_triple_system
from plinth.fl.admm.loopback import run_admm_processes

V, D = 9, 64


def candidate_streams(v: int) -> list[list[np.random.Generator]]:
    """Every way a site of the old code could have seeded its randomness, from the config:
    `run_admm_processes(seed=0)` and `plinth fl admm` round 1 with the app's `seed: 0`."""
    launcher = np.random.SeedSequence(0).spawn(v)
    task = np.random.SeedSequence([0, 0xADA, 1]).spawn(v)
    return [[np.random.default_rng(s) for s in seeds] for seeds in (launcher, task)]


def replay(me: int, received: list[tuple[int, int, np.ndarray]], pi: np.ndarray,
           config: ADMMConfig, rngs: list[np.random.Generator]) -> dict[int, np.ndarray]:
    """Site `me`'s estimate of each partner's model from iteration 0, assuming the partners'
    generators are `rngs` (regenerated from a seed in the config)."""
    design = kirkman_triple_system(V)
    group = group_of(design, 0, me)
    rho = config.rho(0)
    lam, shares = {}, {}
    for s in group:  # replay each member's draws in the order Site makes them
        lam[s] = rngs[s].normal(0.0, config.lambda_std, D)
        for p in (q for q in group if q != s):
            shares[s, p] = rngs[s].integers(0, np.iinfo(np.uint64).max, size=D,
                                            dtype=np.uint64, endpoint=True)
    first = {}
    for sender, _seq, arr in received:  # per sender: its share, then its partial sum
        if arr.dtype != np.uint8:  # (its public key for the pair masks comes first)
            first.setdefault(sender, []).append(arr)
    out = {}
    for j in (q for q in group if q != me):
        other = next(q for q in group if q not in (me, j))
        partial = first[j][1]
        value = partial - shares[me, j] - shares[other, j] + shares[j, me] + shares[j, other]
        y = decode(value) / pi[j]
        out[j] = ((y - lam[j] / rho) * (2.0 + rho) + lam[j]) / 2.0  # z = 0 in iteration 0
    return out


def test_a_site_holding_the_config_cannot_replay_its_partners_randomness():
    rng = np.random.default_rng(5)
    w = rng.normal(size=(V, D))
    n = rng.integers(10, 100, V).tolist()
    pi = np.asarray(n, np.float64) / sum(n)
    config = ADMMConfig()
    rep, sites = run_admm_processes(w, n, config=config, timeout=60, audit=True)
    assert rep.errors[-1] < 1e-6  # the protocol still averages
    me = 0
    best = np.inf
    for rngs in candidate_streams(V):
        for j, guess in replay(me, sites[me].audit_log, pi, config, rngs).items():
            err = float(np.max(np.abs(guess - w[j])) / np.max(np.abs(w[j])))
            best = min(best, err)
    print(f"seed-replay attack: best relative recovery error {best:.3g}")
    # chance: guessing 0 has relative error 1; the attack must not beat it
    assert best > 1.0


def test_plinth_fl_admm_sites_draw_nothing_from_the_app_seed(tmp_path, monkeypatch):
    """The task path (`plinth fl admm`, `train_site`), where the finding was: site 0 of the same
    YAML, run twice, must not draw the λ₀ the old code derived from the app's seed (round 1:
    SeedSequence([seed, 0xADA, 1]).spawn(v)[me]), nor the same λ₀ twice."""
    from plinth.fl.admm import task
    from plinth.fl.rounds import initial_model

    tiny = Path(__file__).parent / "apps" / "tiny.py"
    app = tmp_path / "admm.yaml"
    app.write_text(f"name: t\ncode: {tiny}\nseed: 0\ndata: {{source: digits, partition: iid}}\n"
                   "train: {epochs: 1, batch_size: 16, lr: 0.1}\nadmm: {sites: 3, rounds: 1}\n")
    spec, a = task.load_admm_app(str(app))
    drawn = []

    def keep_site(site, design, iters, ex):  # the exchange is not needed: keep λ₀ and stop
        drawn.append(site.lam.copy())
        return [site.w]

    monkeypatch.setattr(task, "site_loop", keep_site)
    _, params = initial_model(spec)
    for _ in range(2):
        task.train_site(spec, a, type("Ex", (), {"me": 0})(), params, lambda *_: None)
    old = np.random.default_rng(np.random.SeedSequence([spec.seed, 0xADA, 1]).spawn(3)[0])
    replayed = old.normal(0.0, 1.0, drawn[0].shape)
    assert drawn[0].shape == drawn[1].shape and drawn[0].size > 100
    assert not np.allclose(drawn[0], replayed) and not np.allclose(drawn[1], replayed)
    assert not np.allclose(drawn[0], drawn[1])
