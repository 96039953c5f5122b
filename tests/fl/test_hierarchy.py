import os

import numpy as np

from plinth.fl import serde
from plinth.fl.aggregate.engine import weighted_mean
from plinth.fl.aggregate.hierarchy import Hierarchy
from plinth.fl.messages import FitRes


def _exists(name):
    return os.path.exists(f"/dev/shm/{name.lstrip('/')}")


def test_tree_equals_flat_mean_rejects_bad_updates_and_frees_memory():
    rng = np.random.default_rng(0)
    template = [np.zeros((100, 30), np.float32), np.zeros(7, np.float32)]
    ups = [([rng.standard_normal(t.shape).astype(np.float32) for t in template],
            float(rng.integers(1, 20))) for _ in range(10)]
    tree = Hierarchy(template, leaves=3)
    try:
        for k, (arrays, w) in enumerate(ups):
            tree.submit(serde.encode(FitRes(1, arrays, int(w))), w, tag=f"c{k}")
        bad = [ups[0][0][0].copy(), ups[0][0][1]]
        bad[0][5, 5] = np.nan
        tree.submit(serde.encode(FitRes(1, bad, 3)), 3.0, tag="nan")
        tree.submit(b"garbage", 1.0, tag="corrupt")
        got = tree.finish(timeout=60)
        held = set(tree.blocks())  # the tree's own blocks, not other tests' running alongside
        # a second round through the same tree
        tree.submit(serde.encode(FitRes(2, ups[1][0], 1)), 1.0)
        again = tree.finish(timeout=60)
        held |= set(tree.blocks())
        assert held and all(_exists(n) for n in held)  # visible while the tree is up
    finally:
        tree.close()
    assert got.count == 10 and got.total_weight == sum(w for _, w in ups)
    for g, r in zip(got.mean(), weighted_mean(ups)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    assert sorted(tag for tag, _ in got.rejected) == ["corrupt", "nan"]
    assert again.count == 1
    np.testing.assert_allclose(again.mean()[0], ups[1][0][0], rtol=1e-6)
    assert not [n for n in held if _exists(n)]
