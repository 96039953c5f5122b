"""The replay simulator on small synthetic traces, and `plinth serve sim` through its Typer app."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from plinth.cli.serve import app
from plinth.core.errors import SpecError
from plinth.serve.policies import make_policy
from plinth.serve.sim import SimConfig, simulate
from plinth.serve.traces import CountTrace, ServiceTime

SVC = ServiceTime("lognorm", shape=0.36, loc=0.073, scale=0.087)


def synthetic(n: int = 3, minutes: int = 20, peak: int = 900, seed: int = 0) -> CountTrace:
    rng = np.random.default_rng(seed)
    t = np.arange(minutes)[:, None]
    shape = 0.6 + 0.4 * np.sin(t / 4 + rng.uniform(0, 6, n)[None, :])
    return CountTrace("synthetic", tuple(f"job{i}" for i in range(n)),
                      rng.poisson(peak * shape).astype(np.int64))


def test_replay_accounts_for_every_request_and_is_deterministic() -> None:
    tr = synthetic()
    cfg = SimConfig(service=SVC, quota=12, seed=3)
    a = simulate(tr, make_policy("faro-fairsum"), cfg)
    b = simulate(tr, make_policy("faro-fairsum"), cfg)
    assert a.requests == int(tr.counts.sum())
    assert a.slo_violation_rate == b.slo_violation_rate and a.dropped == b.dropped
    assert 0.0 <= a.slo_violation_rate <= 1.0 and 0.0 <= a.lost_utility <= len(tr.jobs)
    assert a.replicas.shape == (tr.minutes * 6, 3) and a.replicas.sum(axis=1).max() <= 12
    assert a.solver_ms_mean > 0 and a.p50_latency_s <= a.p99_latency_s


def test_overload_drops_and_counts_them_as_violations() -> None:
    tr = synthetic(peak=4000)
    r = simulate(tr, make_policy("fairshare"), SimConfig(service=SVC, quota=3))
    assert r.dropped > 0
    assert r.slo_violation_rate >= r.dropped / r.requests * 0.5
    roomy = simulate(tr, make_policy("fairshare"), SimConfig(service=SVC, quota=60))
    assert roomy.dropped == 0 and roomy.slo_violation_rate < r.slo_violation_rate


def test_faro_beats_static_share_on_skewed_load() -> None:
    tr = synthetic(n=4, minutes=30, peak=800)
    tr = CountTrace("skewed", tr.jobs, tr.counts * np.array([[4, 1, 1, 1]]))
    cfg = SimConfig(service=SVC, quota=20)
    faro = simulate(tr, make_policy("faro-fairsum"), cfg)
    static = simulate(tr, make_policy("fairshare"), cfg)
    assert faro.slo_violation_rate < static.slo_violation_rate


def test_bad_setups() -> None:
    with pytest.raises(SpecError, match="--slo-ms: 100 ms is not above"):
        SimConfig(service=SVC, slo_s=0.1)
    with pytest.raises(SpecError, match="quota: 2 replicas cannot give 3 jobs"):
        simulate(synthetic(), make_policy("aiad"), SimConfig(service=SVC, quota=2))


def _trace_file(tmp_path: Path) -> Path:
    tr = synthetic(n=2, minutes=8)
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"ts": m, "counts": {j: {"classifier": int(tr.counts[m, i])}
                                                         for i, j in enumerate(tr.jobs)}}) + "\n"
                         for m in range(tr.minutes)))
    return p


def test_cli_sim_table_json_and_plots(tmp_path: Path) -> None:
    svc = tmp_path / "svc.yaml"
    svc.write_text("type: lognorm\nparams: {shape: 0.36, loc: 0.073, scale: 0.087}\n")
    out = tmp_path / "plots"
    res = CliRunner().invoke(app, [
        "sim", "--trace", str(_trace_file(tmp_path)), "--service-time", str(svc), "--cpus", "8",
        "--policy", "faro-fairsum", "--compare", "ray-serve,oneshot,aiad,mark,fairshare",
        "--json", str(tmp_path / "r.json"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["policy"] for r in rows] == ["faro-fairsum", "ray-serve", "oneshot", "aiad", "mark",
                                           "fairshare"]
    for key in ("slo_violation_rate", "lost_utility", "p50_latency_s", "p99_latency_s", "dropped",
                "solver_ms_mean"):
        assert all(key in r for r in rows)
    assert (out / "replicas.png").stat().st_size > 0
    assert "faro-fairsum" in res.output


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ts": 0, "counts": {"a": 1}}\n{"ts": 1, "counts": {"a": -1}}\n')
    res = CliRunner().invoke(app, ["sim", "--trace", str(bad), "--out", ""])
    assert res.exit_code != 0
    assert f"{bad}:2: job 'a': negative count -1" in str(res.exception)
    res = CliRunner().invoke(app, ["sim", "--trace", str(bad), "--policy", "magic"])
    assert "unknown policy 'magic'" in str(res.exception)


def test_cli_finds_default_traces_only_through_plinth_traces(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PLINTH_TRACES", raising=False)
    res = CliRunner().invoke(app, ["sim", "--out", ""])
    assert res.exit_code != 0
    assert str(res.exception) == ("--trace: name a file, or set PLINTH_TRACES to the folder of "
                                  "traces that holds faro-twitter/jobs10_6h.jsonl")
    folder = tmp_path / "traces"
    (folder / "faro-twitter").mkdir(parents=True)
    _trace_file(tmp_path).rename(folder / "faro-twitter/jobs10_6h.jsonl")
    monkeypatch.setenv("PLINTH_TRACES", str(folder))
    res = CliRunner().invoke(app, ["sim", "--out", "", "--policy", "aiad"])
    assert "--service-time: " in str(res.exception) and "does not exist" in str(res.exception)
    (folder / "faro-twitter/resnet34_latency_lognorm.yaml").write_text(
        "type: constant\nparams: {value: 0.1}\n")
    res = CliRunner().invoke(app, ["sim", "--out", "", "--policy", "aiad", "--cpus", "8"])
    assert res.exit_code == 0, res.output
    assert "jobs10_6h.jsonl" in res.output


def test_drop_variant_sheds_load_and_counts_it() -> None:
    tr = synthetic(n=3, minutes=15, peak=1500)
    cfg = SimConfig(service=SVC, quota=9)
    shed = simulate(tr, make_policy("faro-fairsum-drop"), cfg)
    assert shed.requests == int(tr.counts.sum())
    assert shed.dropped > 0 and shed.slo_violation_rate > 0


def test_cli_policies_lists_every_policy() -> None:
    res = CliRunner().invoke(app, ["policies"])
    assert res.exit_code == 0
    for name in ("faro-fairsum", "faro-sum-drop", "ray-serve", "oneshot", "aiad", "mark",
                 "fairshare"):
        assert name in res.output


def test_trace_timestamps_are_replayed_as_they_are() -> None:
    # The same 10 × 300 requests, spread over each minute or all in its first second.
    counts = np.full((10, 1), 300, np.int64)
    burst = (np.concatenate([m * 60.0 + np.linspace(0, 1, 300, endpoint=False)
                             for m in range(10)]),)
    spread = CountTrace("spread", ("a",), counts)
    bursty = CountTrace("bursty", ("a",), counts, burst)
    cfg = SimConfig(service=SVC, quota=3)
    calm = simulate(spread, make_policy("fairshare"), cfg)
    hot = simulate(bursty, make_policy("fairshare"), cfg)
    assert calm.requests == hot.requests == 3000
    assert hot.dropped > 0 and hot.slo_violation_rate > calm.slo_violation_rate + 0.3
    assert bursty.window(2, 4).arrivals[0].size == 600
    assert bursty.window(2, 4).arrivals[0].min() >= 0.0


def test_hops_add_the_measured_time_to_each_request_and_no_replica_time() -> None:
    """A constant hop of h shifts every latency by h (compressed: c*h of trace time, reported
    in the replay's seconds again) and holds no replica: the same requests are dropped."""
    tr = synthetic(minutes=10)
    base = SimConfig(service=SVC, quota=12, seed=1, compress=5)
    plain = simulate(tr, make_policy("fairshare"), base)
    hop = 0.01  # 10 ms of the compressed replay's time: 50 ms of the trace's
    hopped = simulate(tr, make_policy("fairshare"), SimConfig(
        service=SVC, quota=12, seed=1, compress=5, hop_s=(hop,)))
    assert hopped.dropped == plain.dropped and hopped.requests == plain.requests
    # (latencies are read from a histogram with 0.46% wide bins)
    assert hopped.p50_latency_s == pytest.approx(plain.p50_latency_s + hop, rel=0.01)
    assert hopped.p99_latency_s == pytest.approx(plain.p99_latency_s + hop, rel=0.01)
    assert hopped.request_violation_rate >= plain.request_violation_rate
    # A hop near the SLO makes nearly every request late.
    late = simulate(tr, make_policy("fairshare"), SimConfig(
        service=SVC, quota=12, seed=1, compress=5, hop_s=(0.7 / 5,)))
    assert late.request_violation_rate > 0.9


def test_the_request_weighted_rate_counts_requests_not_minutes() -> None:
    """One busy minute in ten with every request late: Faro's rate (the mean over minutes)
    sees a tenth; counted per request, it is most requests."""
    counts = np.full((10, 1), 10, np.int64)
    counts[3, 0] = 20_000
    r = simulate(CountTrace("burst", ("a",), counts), make_policy("fairshare"),
                 SimConfig(service=SVC, quota=1, cold_start_s=0))
    assert r.slo_violation_rate < 0.2 < 0.9 < r.request_violation_rate


def test_bad_hops_are_one_line(tmp_path: Path) -> None:
    from plinth.serve.sim import load_hops

    with pytest.raises(SpecError, match="--hop: every hop time must be a finite"):
        SimConfig(service=SVC, hop_s=(0.01, -0.002))
    cases = {"missing.json": None, "text.json": "not json", "empty.json": "[]",
             "strings.json": '["1ms"]', "object.json": '{"hops": [0.1]}'}
    for name, text in cases.items():
        p = tmp_path / name
        if text is not None:
            p.write_text(text)
        with pytest.raises(SpecError) as e:
            load_hops(str(p))
        assert str(e.value).startswith("--hop: ") and str(p) in str(e.value)
        assert "\n" not in str(e.value)
    (tmp_path / "ok.json").write_text('{"hop_s": [0.001, 0.002]}')
    assert load_hops(str(tmp_path / "ok.json")) == (0.001, 0.002)
    svc = tmp_path / "svc.yaml"
    svc.write_text("type: lognorm\nparams: {shape: 0.36, loc: 0.073, scale: 0.087}\n")
    res = CliRunner().invoke(app, ["sim", "--trace", str(_trace_file(tmp_path)),
                                   "--service-time", str(svc), "--hop",
                                   str(tmp_path / "empty.json"), "--out", ""])
    assert res.exit_code != 0 and "--hop: " in str(res.exception)


def test_replicas_added_counts_the_cold_starts_of_a_replay() -> None:
    tr = synthetic(n=2, minutes=12, peak=600)
    ramp = CountTrace("ramp", tr.jobs, (tr.counts * np.linspace(0.2, 3, 12)[:, None])
                      .astype(np.int64))
    static = simulate(ramp, make_policy("fairshare"), SimConfig(service=SVC, quota=12))
    assert static.replicas_added() == 0 and static.row()["replicas_added"] == 0
    grown = simulate(ramp, make_policy("aiad"), SimConfig(service=SVC, quota=12))
    total = grown.replicas.sum(axis=1)  # it scales down first, then up with the ramp
    low = int(total.argmin())
    assert grown.replicas_added() >= total[low:].max() - total[low] > 0
