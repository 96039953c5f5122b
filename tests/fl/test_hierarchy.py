import gc
import os
import threading

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


def test_landed_updates_fold_in_place_and_a_dropped_landing_frees_its_slot():
    """Uploads land in slots (at most all but one: a copy always finds a slot), a landed
    update is folded from its slot without a copy, and a landed buffer dropped unfolded (a
    broken or refused upload) puts its slot back."""
    rng = np.random.default_rng(1)
    template = [np.zeros((50, 20), np.float32), np.zeros(9, np.float32)]
    u0, u1 = ([rng.standard_normal(t.shape).astype(np.float32) for t in template]
              for _ in range(2))
    enc = serde.encode(FitRes(1, u0, 4))
    tree = Hierarchy(template, leaves=1, slots=3)
    try:
        first, spare = tree.land(len(enc)), tree.land(len(enc))
        third = []
        waiting = threading.Thread(target=lambda: third.append(tree.land(len(enc))))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive()  # the last slot is kept for a copy ...
        tree.submit_arrays(u1, 2.0, tag="copied")  # ... which is not held up
        serde.join_into(serde.chunks(enc, 1000), first)
        tree.submit_arrays(serde.decode(first, expect=FitRes).update, 4.0, tag="landed")
        waiting.join(30)  # the landed one went to a leaf: another upload may land
        assert third and third[0] is not None
        del first, spare, third
        gc.collect()
        got = tree.finish(timeout=60)
        assert sorted(tree._free) == [0, 1, 2] and not tree._landed
        assert (tree.landings, tree.copied) == (3, 1)
    finally:
        tree.close()
    assert got.count == 2 and not got.rejected
    for g, r in zip(got.mean(), weighted_mean([(u0, 4.0), (u1, 2.0)])):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
