import dataclasses
import hashlib

import numpy as np
import pytest
from scipy import stats

from plinth.fl.privacy.masking import dequantize, expand_mask, quantize
from plinth.fl.privacy.secagg import (
    AdvertiseKeys,
    ClientSecAgg,
    MaskedInput,
    SecAggAbort,
    SecAggConfig,
    SecAggError,
    ServerSecAgg,
    ShareKeys,
    UnmaskResponse,
)
from plinth.fl.privacy.secagg_driver import run_secagg_round


def det_bytes(seed):
    """Deterministic random_bytes for reproducible tests (production uses os.urandom)."""
    counter = [0]

    def rb(n):
        counter[0] += 1
        out = b""
        while len(out) < n:
            out += hashlib.sha256(f"{seed}:{counter[0]}:{len(out)}".encode()).digest()
        return out[:n]

    return rb


def expected_sum(cfg, updates, survivors):
    tot = np.zeros(cfg.vector_len, dtype=np.uint32)
    for c in survivors:
        tot += quantize(updates[c], clip=cfg.clip, scale=cfg.scale)
    return tot


@pytest.mark.parametrize(
    ("n", "d", "full", "drop_frac"),
    [
        (10, 64, True, 0.3),
        (10, 64, False, 0.2),
        (50, 32, False, 0.15),
        (120, 8, False, 0.15),
        (200, 4, False, 0.1),
    ],
)
def test_unmasked_sum_is_exact(n, d, full, drop_frac):
    rng = np.random.default_rng(n)
    cfg = SecAggConfig(
        client_ids=tuple(range(n)), vector_len=d, full_graph=full, graph_seed=n, round_id=3
    )
    updates = {c: rng.uniform(-1.5, 1.5, d) for c in range(n)}
    ndrop = int(drop_frac * n)
    dropped = rng.choice(n, ndrop, replace=False).tolist()
    half = ndrop // 2
    drop = {"masked_input": set(dropped[:half]), "unmask": set(dropped[half:])}
    out = run_secagg_round(cfg, updates, drop=drop, random_bytes=det_bytes(n))
    assert set(out.result.dropped) == set(dropped[:half])
    assert set(out.result.survivors) == set(range(n)) - set(dropped[:half])
    np.testing.assert_array_equal(
        out.result.total, expected_sum(cfg, updates, out.result.survivors)
    )
    plain = sum(np.clip(updates[c], -1, 1) for c in out.result.survivors)
    assert np.max(np.abs(out.total - plain)) <= n / (2 * cfg.scale) + 1e-12


def test_dropout_before_sharing_is_excluded():
    n, d = 12, 16
    rng = np.random.default_rng(1)
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=d, full_graph=True)
    updates = {c: rng.uniform(-1, 1, d) for c in range(n)}
    out = run_secagg_round(cfg, updates, drop={"share_keys": {0, 1}, "advertise": {2}})
    assert set(out.result.survivors) == set(range(3, n))
    np.testing.assert_array_equal(out.result.total, expected_sum(cfg, updates, range(3, n)))


def test_too_many_dropouts_abort_cleanly():
    n, d = 12, 16
    rng = np.random.default_rng(2)
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=d, full_graph=True)
    updates = {c: rng.uniform(-1, 1, d) for c in range(n)}
    with pytest.raises(SecAggAbort, match="threshold"):
        run_secagg_round(cfg, updates, drop={"masked_input": set(range(7))})
    # Survived masking but too few answer the unmask request: abort, nothing output.
    with pytest.raises(SecAggAbort, match="shares for client"):
        run_secagg_round(cfg, updates, drop={"unmask": set(range(8))})


def test_abort_drops_masked_inputs_and_output():
    n, d = 10, 8
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=d, full_graph=True)
    server = ServerSecAgg(cfg)
    clients = {c: ClientSecAgg(c, cfg) for c in range(n)}
    for c in clients.values():
        server.receive(c.advertise())
    for c, m in server.close_advertise().items():
        server.receive(clients[c].share_keys(m))
    fwd = server.close_share_keys()
    for c in (0, 1):
        server.receive(clients[c].masked_input(fwd[c], np.zeros(d)))
    with pytest.raises(SecAggAbort):
        server.close_masked_input()
    assert server.result is None
    assert all(not box for box in server._inbox.values())
    assert server.stage.value == "aborted"


def test_masked_vector_looks_uniform():
    # The server's view of one client's masked input, over many fresh rounds with the same
    # (all-zero) update, must be indistinguishable from uniform on [0, 2^32).
    n, d = 5, 400
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=d, full_graph=True)
    views = []
    for r in range(10):
        cfg_r = dataclasses.replace(cfg, round_id=r)
        out = {}

        def grab(stage, msg, out=out):
            if stage == "masked_input" and msg.sender == 0:
                out["v"] = msg.vector.copy()
            return msg

        run_secagg_round(cfg_r, {c: np.zeros(d) for c in range(n)}, tamper=grab)
        views.append(out["v"])
    v = np.concatenate(views).astype(np.float64) / 2**32
    assert stats.kstest(v, "uniform").pvalue > 1e-3
    counts = np.bincount((v * 16).astype(int), minlength=16)
    assert stats.chisquare(counts).pvalue > 1e-3
    # And the raw encoding of zeros is clearly not uniform (the test can fail).
    raw = quantize(np.zeros(d), clip=1, scale=cfg.scale).astype(np.float64) / 2**32
    assert stats.kstest(raw, "uniform").pvalue < 1e-6


def test_mask_is_chacha20_of_full_key():
    k1, k2 = bytes(32), bytes(31) + b"\x01"
    a, b = expand_mask(k1, 1000), expand_mask(k2, 1000)
    assert a.dtype == np.uint32 and not np.array_equal(a, b)
    with pytest.raises(ValueError, match="32 bytes"):
        expand_mask(b"\x00" * 4, 10)


def test_malformed_and_replayed_messages_rejected(caplog):
    n, d = 8, 8
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=d, full_graph=True, round_id=7)
    server = ServerSecAgg(cfg)
    clients = {c: ClientSecAgg(c, cfg) for c in range(n)}
    adv = {c: clients[c].advertise() for c in range(n)}
    for m in adv.values():
        assert server.receive(m)
    assert not server.receive(adv[0])  # replay
    assert not server.receive(dataclasses.replace(adv[1], round_id=6))  # stale round
    assert not server.receive(AdvertiseKeys(7, 99, bytes(32), bytes(32)))  # unknown sender
    reasons = [r.reason for r in server.rejections]
    assert "duplicate AdvertiseKeys (replay)" in reasons
    assert any("replayed or stale" in r for r in reasons)
    assert any("not a client" in r for r in reasons)
    dirs = server.close_advertise()
    shares = {c: clients[c].share_keys(dirs[c]) for c in range(n)}
    bad_ct = dict(shares[2].ciphertexts)
    bad_ct[3] = bad_ct[3][:-1]
    assert not server.receive(dataclasses.replace(shares[2], ciphertexts=bad_ct))
    assert not server.receive(ShareKeys(7, 4, b"short", shares[4].ciphertexts))
    assert not server.receive(adv[5])  # wrong stage
    for c in range(n):
        assert server.receive(shares[c])
    fwd = server.close_share_keys()
    assert not server.receive(MaskedInput(7, 0, np.zeros(d, dtype=np.float32)))
    assert not server.receive(MaskedInput(7, 0, np.zeros(d + 1, dtype=np.uint32)))
    masked = {c: clients[c].masked_input(fwd[c], np.full(d, 0.25)) for c in range(n)}
    for m in masked.values():
        assert server.receive(m)
    reqs = server.close_masked_input()
    resp = {c: clients[c].unmask(reqs[c]) for c in range(n)}
    assert not server.receive(UnmaskResponse(7, 1, {}, {0: 5}))  # key share of a survivor
    for m in resp.values():
        assert server.receive(m)
    res = server.close_unmask()
    np.testing.assert_allclose(dequantize(res.total, scale=cfg.scale), np.full(d, 0.25 * n))
    assert "secagg rejected message" in caplog.text


def test_client_refuses_replayed_or_inconsistent_requests():
    n, d = 6, 4
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=d, full_graph=True, round_id=1)
    server = ServerSecAgg(cfg)
    clients = {c: ClientSecAgg(c, cfg) for c in range(n)}
    for c in clients.values():
        server.receive(c.advertise())
    dirs = server.close_advertise()
    with pytest.raises(SecAggError, match="replayed or misrouted"):
        clients[0].share_keys(dataclasses.replace(dirs[0], round_id=0))
    for c in range(1, n):
        server.receive(clients[c].share_keys(dirs[c]))
    fwd = server.close_share_keys()
    for c in range(1, n):
        server.receive(clients[c].masked_input(fwd[c], np.zeros(d)))
    req = server.close_masked_input()[1]
    # A server asking for both shares of one client would learn its input: refused.
    both = dataclasses.replace(req, dropped=req.dropped | {2})
    with pytest.raises(SecAggError, match="both survived and dropped"):
        clients[1].unmask(both)


def test_invalid_share_is_detected_and_round_survives(caplog):
    n, d = 9, 8
    rng = np.random.default_rng(5)
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=d, full_graph=True)
    updates = {c: rng.uniform(-1, 1, d) for c in range(n)}

    def corrupt(stage, msg):
        if stage == "unmask" and msg.sender == 4:
            bad = {j: (y + 1) % (1 << 256) for j, y in msg.seed_shares.items()}
            return dataclasses.replace(msg, seed_shares=bad)
        return msg

    out = run_secagg_round(cfg, updates, tamper=corrupt)
    np.testing.assert_array_equal(out.result.total, expected_sum(cfg, updates, range(n)))
    assert out.result.invalid_shares and all(h == 4 for _, h in out.result.invalid_shares)
    assert "invalid share" in caplog.text


def test_config_rejects_overflowing_encoding():
    with pytest.raises(ValueError, match="2\\^31"):
        SecAggConfig(client_ids=tuple(range(100)), vector_len=4, clip=1000.0, scale=2**16)
    with pytest.raises(ValueError, match="NaN"):
        quantize(np.array([np.nan]), clip=1, scale=10)


def test_distributed_dp_through_secagg():
    # Each client adds its share of the noise before masking; the unmasked sum carries the
    # full central noise (variance (z C)^2) and the server never sees a noiseless sum.
    from plinth.fl.privacy.dp import NumpyNoise, distributed_noise_share

    n, d, z, clip = 20, 4000, 1.0, 0.5
    rng = np.random.default_rng(11)
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=d, clip=4.0, scale=2**20)
    updates = {
        c: distributed_noise_share(
            np.zeros(d),
            clip_norm=clip,
            noise_multiplier=z,
            min_honest_clients=n,
            noise=NumpyNoise(rng),
        )
        for c in range(n)
    }
    out = run_secagg_round(cfg, updates)
    assert np.std(out.total) == pytest.approx(z * clip, rel=0.05)


from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=15, deadline=None)
@given(n=st.integers(5, 14), d=st.integers(1, 6), full=st.booleans(), data=st.data())
def test_property_sum_exact_or_clean_abort(n, d, full, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=d, full_graph=full, graph_seed=n)
    updates = {c: rng.uniform(-2, 2, d) for c in range(n)}
    drop = {
        s: set(data.draw(st.lists(st.integers(0, n - 1), max_size=n // 2)))
        for s in ("share_keys", "masked_input", "unmask")
    }
    try:
        out = run_secagg_round(cfg, updates, drop=drop, random_bytes=det_bytes(n))
    except SecAggAbort as exc:
        assert str(exc)  # an abort always says why
        return
    assert not set(out.result.survivors) & (drop["share_keys"] | drop["masked_input"])
    np.testing.assert_array_equal(
        out.result.total, expected_sum(cfg, updates, out.result.survivors)
    )
