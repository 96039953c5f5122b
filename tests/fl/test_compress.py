import numpy as np
import pytest

from plinth.fl import serde
from plinth.fl.aggregate.engine import UpdateRejected
from plinth.fl.compress import Compressor, decompress
from plinth.fl.messages import FitRes


def _delta(rng):
    return [rng.standard_normal((64, 50)).astype(np.float32), np.arange(3, dtype=np.int64)]


def _template(d):
    return [(a.shape, a.dtype) for a in d]


@pytest.mark.parametrize("kind, bits", [("q8", 8), ("q16", 16)])
def test_quantisation_error_is_half_a_step_and_bytes_shrink(kind, bits):
    d = _delta(np.random.default_rng(0))
    arrays, codec, meta = Compressor(kind).encode(d)
    back = decompress(arrays, codec, meta, _template(d))
    step = (d[0].max() - d[0].min()) / (2 ** bits - 1)
    assert np.abs(back[0] - d[0]).max() <= step / 2 + 1e-6
    np.testing.assert_array_equal(back[1], d[1])
    dense = len(serde.encode(FitRes(1, d, 1)))
    small = len(serde.encode(FitRes(1, arrays, 1, {}, codec, meta)))
    assert small < dense * (bits / 32 + 0.1)


def test_topk_keeps_the_largest_entries():
    d = _delta(np.random.default_rng(1))
    arrays, codec, meta = Compressor("topk", ratio=0.05, error_feedback=False).encode(d)
    back = decompress(arrays, codec, meta, _template(d))[0]
    k = int(np.ceil(0.05 * d[0].size))
    assert np.count_nonzero(back) == k
    kept = np.abs(d[0]).reshape(-1)[np.flatnonzero(back.reshape(-1))]
    assert kept.min() >= np.sort(np.abs(d[0]).reshape(-1))[-k] - 1e-7


def test_error_feedback_delivers_everything_eventually():
    rng = np.random.default_rng(2)
    c = Compressor("topk", ratio=0.1, error_feedback=True)
    d = _delta(rng)
    sent = np.zeros_like(d[0])
    for _ in range(10):  # the same delta ten times
        arrays, codec, meta = c.encode(d)
        sent += decompress(arrays, codec, meta, _template(d))[0]
    # what was sent plus what is still held back equals everything that was put in
    np.testing.assert_allclose(sent + c.residual[0], 10 * d[0], rtol=1e-4, atol=1e-4)
    no_ef = Compressor("topk", ratio=0.1, error_feedback=False)
    a2, c2, m2 = no_ef.encode(d)
    lost = np.abs(10 * decompress(a2, c2, m2, _template(d))[0] - 10 * d[0]).sum()
    assert np.abs(sent - 10 * d[0]).sum() < lost


def test_malformed_compressed_updates_are_rejected():
    d = _delta(np.random.default_rng(3))
    arrays, codec, meta = Compressor("topk", ratio=0.1).encode(d)
    bad = [arrays[0] + np.uint32(10_000), arrays[1], arrays[2]]
    with pytest.raises(UpdateRejected, match="out of range"):
        decompress(bad, codec, meta, _template(d))
    with pytest.raises(UpdateRejected, match="malformed"):
        decompress(arrays, codec, {}, _template(d))
    with pytest.raises(UpdateRejected, match="unknown codec"):
        decompress(arrays, "zip", meta, _template(d))
