import numpy as np
import pytest

from plinth.fl.aggregate.engine import StreamingAggregator, UpdateRejected, weighted_mean


def _updates(rng, n, shapes, dtype=np.float32):
    return [([rng.standard_normal(s).astype(dtype) for s in shapes], float(rng.integers(1, 50)))
            for _ in range(n)]


def _reference(ups):
    w = np.array([u[1] for u in ups])
    return [np.average(np.stack([u[0][i] for u in ups]).astype(np.float64), axis=0, weights=w)
            for i in range(len(ups[0][0]))]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("chunk_bytes", [4096, 1 << 20])
def test_streaming_mean_matches_stacked_average(threads, chunk_bytes):
    rng = np.random.default_rng(1)
    ups = _updates(rng, 25, [(123, 77), (5,), (2, 3, 4), ()])
    got = weighted_mean(ups, threads=threads, chunk_bytes=chunk_bytes)
    for g, r, u in zip(got, _reference(ups), ups[0][0]):
        assert g.shape == u.shape and g.dtype == u.dtype
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_float64_models_accumulate_in_float64():
    rng = np.random.default_rng(2)
    ups = _updates(rng, 10, [(1000,)], np.float64)
    got = weighted_mean(ups)
    np.testing.assert_allclose(got[0], _reference(ups)[0], rtol=1e-12)


def test_integer_buffers_are_rounded_means():
    ups = [([np.array([10, 20], np.int64)], 1.0), ([np.array([13, 20], np.int64)], 2.0)]
    got = weighted_mean(ups)[0]
    assert got.dtype == np.int64 and got.tolist() == [12, 20]


@pytest.mark.parametrize("chunk_bytes", [4096, 1 << 20])  # undo across chunks / blocks of one
@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
def test_non_finite_update_is_rejected_and_undone(bad_value, chunk_bytes):
    rng = np.random.default_rng(3)
    ups = _updates(rng, 3, [(300, 301), (7,)])
    agg = StreamingAggregator(ups[0][0], threads=2, chunk_bytes=chunk_bytes)
    for arrays, w in ups[:2]:
        agg.add(arrays, w)
    before = [s.copy() for s in agg.sums()]
    bad = [ups[2][0][0].copy(), ups[2][0][1]]
    bad[0][250, 3] = bad_value  # late in the array: many chunks were folded before it
    with pytest.raises(UpdateRejected, match="NaN or Inf"):
        agg.add(bad, 5.0)
    assert agg.count == 2
    for b, s in zip(before, agg.sums()):
        np.testing.assert_allclose(s, b, atol=1e-4)
    agg.add(*ups[2])
    np.testing.assert_allclose(agg.mean()[0], _reference(ups)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_that_could_overflow_the_sum_are_refused_before_folding(dtype):
    """|w·x| must stay below 2^106 (float32) or 2^1002 (float64): then 2^20 such updates cannot
    overflow the sum, so the accumulator stays finite and a refusal leaves it as it was."""
    bound = 2.0 ** (106 if dtype == np.float32 else 1002)
    agg = StreamingAggregator([np.zeros(5000, dtype)], chunk_bytes=1 << 20)
    ok = np.ones(5000, dtype)
    ok[10] = bound / 4  # |w·x| = bound / 2 with weight 2: accepted
    agg.add([ok], 2.0)
    big = np.ones(5000, dtype)
    big[4321] = bound / 4  # the same value with weight 4 reaches the bound: refused
    with pytest.raises(UpdateRejected, match="index 4321"):
        agg.add([big], 4.0)
    assert agg.count == 1 and np.isfinite(agg.sums()[0]).all()
    np.testing.assert_array_equal(agg.sums()[0], 2.0 * ok)


def test_wrong_shape_dtype_count_weight_are_rejected():
    agg = StreamingAggregator([np.zeros((2, 3), np.float32)])
    with pytest.raises(UpdateRejected, match="shape"):
        agg.add([np.zeros((3, 2), np.float32)], 1.0)
    with pytest.raises(UpdateRejected, match="dtype"):
        agg.add([np.zeros((2, 3), np.float64)], 1.0)
    with pytest.raises(UpdateRejected, match="arrays"):
        agg.add([np.zeros((2, 3), np.float32)] * 2, 1.0)
    with pytest.raises(UpdateRejected, match="weight"):
        agg.add([np.zeros((2, 3), np.float32)], 0.0)
    assert agg.count == 0 and agg.mean() is None


def test_partial_sums_combine_like_one_aggregator():
    rng = np.random.default_rng(4)
    ups = _updates(rng, 12, [(50, 40)])
    leaves = [StreamingAggregator(ups[0][0]) for _ in range(3)]
    for i, (arrays, w) in enumerate(ups):
        leaves[i % 3].add(arrays, w)
    top = StreamingAggregator(ups[0][0])
    for leaf in leaves:
        top.add_sum(leaf.sums(), leaf.total_weight, leaf.count)
    assert top.count == 12
    np.testing.assert_allclose(top.mean()[0], _reference(ups)[0], rtol=1e-5, atol=1e-6)


def test_memory_is_one_model_whatever_the_number_of_updates():
    agg = StreamingAggregator([np.zeros(10_000, np.float32)])
    before = sum(a.nbytes for a in agg._acc)
    rng = np.random.default_rng(5)
    for _ in range(200):
        agg.add([rng.standard_normal(10_000).astype(np.float32)], 1.0)
    assert sum(a.nbytes for a in agg._acc) == before == 40_000


@pytest.mark.parametrize("threads", [1, 2])
def test_add_many_folds_a_batch_and_skips_only_the_bad_ones(threads):
    rng = np.random.default_rng(6)
    ups = _updates(rng, 6, [(200, 50), (9,)])
    bad = [ups[2][0][0].copy(), ups[2][0][1]]
    bad[0][150, 0] = np.inf
    wrong = [np.zeros((3, 3), np.float32), ups[0][0][1]]
    batch = [ups[0], ups[1], (bad, 2.0), (wrong, 1.0), ups[3], ups[4], ups[5]]
    agg = StreamingAggregator(ups[0][0], threads=threads, chunk_bytes=4096)
    rejected = agg.add_many(batch)
    assert [j for j, _ in rejected] == [2, 3]
    assert "NaN or Inf" in rejected[0][1] and "shape" in rejected[1][1]
    good = [u for k, u in enumerate(ups) if k != 2]
    assert agg.count == 5
    np.testing.assert_allclose(agg.mean()[0], _reference(good)[0], rtol=1e-4, atol=1e-5)
