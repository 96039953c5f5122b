"""ADMM sites over the FL transport: gRPC peer exchange on 127.0.0.1, separate processes."""

import importlib.util
import json
import os
from pathlib import Path

import grpc
import numpy as np
import pytest
from typer.testing import CliRunner

from plinth.core.errors import PlinthError, SpecError
from plinth.fl import serde
from plinth.fl.admm.consensus import run_admm
from plinth.fl.admm.loopback import run_admm_processes
from plinth.fl.admm.task import load_admm_app, read_peers
from plinth.fl.transport.peer import SERVICE, PeerExchange

TINY_MODEL = Path(__file__).parents[1] / "fl" / "apps" / "tiny.py"


def _fl_fixtures():
    """tests/fl/conftest.py as a module, for its self-signed `tls_files` fixture."""
    spec = importlib.util.spec_from_file_location(
        "plinth_tests_fl_conftest", Path(__file__).parents[1] / "fl" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tls_files = _fl_fixtures().tls_files


def _looks_encoded(a: np.ndarray) -> float:
    """Share of words whose top byte is 0x00 or 0xff: fixed-point encodings of small values."""
    top = (a >> np.uint64(56)).astype(int)
    return float(np.mean((top == 0) | (top == 255)))


def test_nine_site_processes_over_grpc_average_without_seeing_partner_values():
    v, d = 9, 256
    rng = np.random.default_rng(9)
    w = rng.normal(size=(v, d))
    n = rng.integers(10, 100, v).tolist()
    rep, sites = run_admm_processes(w, n, timeout=60, audit=True)
    pids = {s.pid for s in sites}
    assert len(pids) == v and os.getpid() not in pids
    # each site's randomness is its own CSPRNG, so z matches the in-process run to the
    # fixed-point resolution, not bit for bit
    np.testing.assert_allclose(rep.z, run_admm(w, n, seed=3).z, atol=1e-8)
    assert rep.errors[-1] < 1e-6
    np.testing.assert_allclose(rep.z, (np.asarray(n) / sum(n)) @ w, atol=1e-6)

    sent = [s.result[1] for s in sites]  # each site's encoded pi_i y_i, per iteration
    own = {sent[i][k].tobytes() for i in range(v) for k in range(rep.iterations)}
    for s in sites:
        uniform, keys = [], 0
        for _sender, _seq, arr in s.audit_log:
            assert arr.tobytes() not in own  # no y_i ever crosses the wire in the clear
            if arr.dtype == np.uint8:  # a peer's public key for the pair masks
                assert arr.size == 32
                keys += 1
                continue
            # a share, a partial sum or another triple's masked sum: uniform words, so not
            # even a triple's sum S_g is published
            assert _looks_encoded(arr) < 0.05
            uniform.append(arr)
        # one key from each other site; per iteration a share and a partial from each of 2
        # partners, and 2 other triples' sums
        assert keys == v - 1 and len(uniform) == 6 * rep.iterations
        top = np.bincount((np.concatenate(uniform) >> np.uint64(60)).astype(int), minlength=16)
        expect = 6 * rep.iterations * d / 16  # the top 4 bits of uniform words: flat
        assert np.all(np.abs(top - expect) < 6 * np.sqrt(expect))
        assert s.rejected == []


def _post(port: int, header: bytes, body: bytes, token: str | None) -> None:
    md = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        ch.stream_unary(f"/{SERVICE}/Send")(iter([header, body]), metadata=md, timeout=10)


def _msg(sender: int, seq: int, arr: np.ndarray) -> tuple[bytes, bytes]:
    body = bytes(serde.arrays_to_bytes([arr]))
    return json.dumps({"sender": sender, "seq": seq, "total": len(body)}).encode(), body


def test_peer_exchange_refuses_replays_strangers_bad_tokens_and_bad_frames():
    tokens = {"t0": "0", "t1": "1", "t2": "2", "t7": "7"}  # t7: a site outside this federation
    a = PeerExchange(0, 3, tokens=tokens, token="t0", timeout=1.0)
    b = PeerExchange(1, 3, tokens=tokens, token="t1", timeout=10.0)
    try:
        addrs = [a.address, b.address, "127.0.0.1:1"]
        a.connect(addrs)
        b.connect(addrs)
        x = np.arange(5, dtype=np.uint64)
        _post(a.port, *_msg(2, 1, x), "t2")
        np.testing.assert_array_equal(a.recv(2), x)

        cases = [
            (_msg(2, 1, x), "t2", grpc.StatusCode.ALREADY_EXISTS, "replayed sequence number 1"),
            (_msg(2, 5, x), "t2", grpc.StatusCode.FAILED_PRECONDITION, "out-of-order"),
            (_msg(7, 1, x), "t7", grpc.StatusCode.PERMISSION_DENIED, "unknown site 7"),
            (_msg(2, 2, x), "nope", grpc.StatusCode.UNAUTHENTICATED, "unknown or missing token"),
            (_msg(2, 2, x), None, grpc.StatusCode.UNAUTHENTICATED, "unknown or missing token"),
            (_msg(1, 1, x), "t2", grpc.StatusCode.PERMISSION_DENIED, "belongs to site 2, not 1"),
            ((b"not json", b""), "t2", grpc.StatusCode.INVALID_ARGUMENT, "malformed frame"),
            ((_msg(2, 2, x)[0], b"\0" * len(_msg(2, 2, x)[1])), "t2",
             grpc.StatusCode.INVALID_ARGUMENT, "malformed frame from site 2"),
        ]
        for (header, body), token, code, why in cases:
            with pytest.raises(grpc.RpcError) as e:
                _post(a.port, header, body, token)
            assert e.value.code() == code and why in e.value.details()
            assert why in a.rejected[-1]
        assert len(a.rejected) == len(cases)
        # the site survived all of that: the next genuine messages still arrive, in order
        _post(a.port, *_msg(2, 2, x + 1), "t2")
        b.send(0, x * 3)
        b.send(0, x * 4)
        np.testing.assert_array_equal(a.recv(2), x + 1)
        np.testing.assert_array_equal(a.recv(1), x * 3)
        np.testing.assert_array_equal(a.recv(1), x * 4)
        with pytest.raises(PlinthError, match=r"^site 0: no message from site 2 within 1s$"):
            a.recv(2)
    finally:
        a.close(0)
        b.close(0)


def test_peer_exchange_over_tls_and_a_plaintext_dialler_is_refused(tls_files):
    cert, key = (tls_files / "cert.pem").read_bytes(), (tls_files / "key.pem").read_bytes()
    tokens = {"t0": "0", "t1": "1", "t2": "2"}
    ex = [PeerExchange(i, 3, tokens=tokens, token=f"t{i}", cert=cert, key=key, ca=cert,
                       timeout=10.0) for i in range(3)]
    try:
        addrs = [e.address for e in ex]
        for e in ex:
            e.connect(addrs)
        big = np.random.default_rng(0).integers(0, 2**63, 300_000, dtype=np.uint64)
        ex[0].chunk_size = 1 << 16  # many chunks: the frames are reassembled in order
        ex[0].send(2, big)
        ex[1].send(2, big[:3])
        np.testing.assert_array_equal(ex[2].recv(0), big)
        np.testing.assert_array_equal(ex[2].recv(1), big[:3])
        with pytest.raises(grpc.RpcError):
            _post(ex[2].port, *_msg(1, 2, big[:3]), "t1")  # no TLS: no connection at all
    finally:
        for e in ex:
            e.close(0)


def _app(tmp_path: Path, admm: str, extra: str = "") -> str:
    p = tmp_path / "admm.yaml"
    p.write_text(f"name: tiny-admm\ncode: {TINY_MODEL}\nseed: 0\n"
                 f"data: {{source: digits, partition: iid}}\n"
                 f"train: {{epochs: 1, batch_size: 16, lr: 0.1}}\n"
                 f"admm: {admm}\n{extra}")
    return str(p)


@pytest.mark.parametrize(("admm", "extra", "message"), [
    ("{sites: 10}", "", r"admm\.sites: a Kirkman schedule needs sites = 3 \(mod 6\)"),
    ("{sites: 9, iterations: 8}", "", r"admm: iterations: at most .* = 7 with 9 sites"),
    ("{sites: 9, rho_decay: 1.5}", "", r"admm\.rho_decay: must be <= 1 \(got 1\.5\)"),
    ("{sites: 9, gossip: true}", "", r"admm\.gossip: unknown field"),
    ("{sites: 9}", "privacy: {local_dp: {noise_multiplier: 1.0}}\n",
     r"privacy\.local_dp: not applied by plinth fl admm"),
])
def test_bad_admm_config_is_one_line_naming_the_field(tmp_path, admm, extra, message):
    with pytest.raises(SpecError, match=message) as e:
        load_admm_app(_app(tmp_path, admm, extra))
    assert "\n" not in str(e.value)


def test_cli_sites_override_and_peer_lists(tmp_path):
    with pytest.raises(SpecError, match=r"admm\.sites: .*\(got 12\)"):
        load_admm_app(_app(tmp_path, "{sites: 9}"), sites=12)
    spec, a = load_admm_app(_app(tmp_path, "{sites: 9}"), sites=15, rounds=3)
    assert (a.sites, a.rounds, spec.data.clients) == (15, 3, 15)
    f = tmp_path / "peers.txt"
    f.write_text("# site list\n127.0.0.1:5000\n127.0.0.1:5001  # site 1\n")
    assert read_peers(None, str(f)) == ["127.0.0.1:5000", "127.0.0.1:5001"]
    assert read_peers("a:1, b:2", None) == ["a:1", "b:2"]
    with pytest.raises(SpecError, match="--peers-file: cannot read"):
        read_peers(None, str(tmp_path / "missing.txt"))


def test_cli_runs_a_tiny_admm_task_end_to_end(tmp_path):
    from plinth.cli.fl import app

    out = tmp_path / "admm.json"
    res = CliRunner().invoke(app, ["admm", _app(tmp_path, "{sites: 3, rounds: 5}"), "--sites",
                                   "9", "--rounds", "2", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "round   2  accuracy" in res.output
    doc = json.loads(out.read_text())
    assert doc["sites"] == 9 and doc["admm"]["iterations"] == 7
    assert [r["round"] for r in doc["rounds"]] == [1, 2]
    for r in doc["rounds"]:
        assert set(r) >= {"round", "accuracy", "loss", "seconds", "admm_error"}
        assert r["admm_error"] < 1e-6 < r["admm_errors"][0]
    assert doc["final_accuracy"] == doc["rounds"][-1]["accuracy"] > 0.1  # above chance
