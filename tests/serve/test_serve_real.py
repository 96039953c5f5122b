"""The real serving path on loopback: real replica processes running a PyTorch model, the real
router, and the AIAD policy driven by a fake integer clock (ticks are called, nothing sleeps)."""

from __future__ import annotations

import concurrent.futures as cf
import re

import httpx
import numpy as np
import pytest

from plinth.core.errors import SpecError
from plinth.serve.serving import LocalServing
from plinth.core.spec import load_spec, spec_from_dict

SPEC = {
    "quota": 2, "policy": "aiad", "tick_s": 10,
    "router": {"port": 0, "queue": 8, "concurrency": 2, "timeout_s": 60},
    # An SLO of 1.5 ms is below any HTTP round trip, so a burst is always "over the SLO" and an
    # idle window (no requests: p99 0) is always calm: the test does not depend on speed.
    "jobs": [{"name": "clf", "model": "mlp", "slo_ms": 1.5, "service_ms": 1, "replicas": 1}],
}


def _burst(url: str, n: int) -> list[int]:
    body = {"inputs": np.random.default_rng(0).random((1, 784)).round(3).tolist()}
    with httpx.Client(timeout=120) as client, cf.ThreadPoolExecutor(24) as ex:
        return list(ex.map(lambda _: client.post(url, json=body).status_code, range(n)))


def _metric(text: str, code: int) -> int:
    m = re.search(rf'plinth_serve_requests_total{{job="clf",code="{code}"}} (\d+)', text)
    return int(m.group(1)) if m else 0


def test_scales_up_and_down_without_losing_requests() -> None:
    spec = spec_from_dict(SPEC, kind="Service")
    with LocalServing(spec) as s:
        url = s.url + "/v1/clf/infer"
        first = _burst(url, 60)
        assert set(first) <= {200, 503} and 200 in first
        d = s.tick(10)
        assert d is not None and s.replica_counts() == {"clf": 2}
        s.wait_ready()
        second = _burst(url, 60)
        assert set(second) <= {200, 503} and 200 in second
        procs = list(s.procs["clf"])
        downs = [s.tick(10 * k) for k in range(2, 6)]
        assert s.replica_counts() == {"clf": 1}
        assert any(d is not None and "calm" in d.reason for d in downs)
        stopped = [p for p in procs if p not in s.procs["clf"]]
        assert len(stopped) == 1 and stopped[0].proc.poll() is not None
        # Every request is accounted for: answered, or explicitly refused with 503.
        text = httpx.get(s.url + "/metrics").text
        sent = first + second
        assert _metric(text, 200) == sent.count(200)
        assert _metric(text, 503) == sent.count(503)
        assert _metric(text, 504) == 0
        assert 'plinth_serve_replicas{job="clf"} 1' in text
        assert httpx.post(s.url + "/v1/nope/infer", json={}).status_code == 404
    for p in procs:
        assert p.proc.poll() is not None  # stop() leaves no replica process behind


def test_service_spec_errors_name_the_field(tmp_path) -> None:
    def error(doc: dict) -> str:
        with pytest.raises(SpecError) as e:
            spec_from_dict(doc, source="s.yaml", kind="Service")
        return str(e.value)

    assert error(dict(SPEC, quota=0)) == "s.yaml: quota: must be >= 1 (got 0)"
    bad = dict(SPEC, jobs=[dict(SPEC["jobs"][0], slo_ms=0.5)])
    assert error(bad) == "s.yaml: jobs[0]: slo_ms 0.5 must be above service_ms 1"
    bad = dict(SPEC, jobs=[dict(SPEC["jobs"][0], model="gpt-9")])
    assert error(bad) == ("s.yaml: jobs[0].model: unknown model 'gpt-9'; choose one of: "
                          "tiny-cnn, mlp")
    assert error(dict(SPEC, policy="magic")).startswith("s.yaml: policy: unknown policy 'magic'; "
                                                        "choose one of: faro-sum,")
    p = tmp_path / "s.yaml"
    p.write_text("quota: 1\njobs:\n  - {name: a, slo_ms: 10, service_ms: 1}\n"
                 "  - {name: b, slo_ms: 10, service_ms: 1}\n")
    with pytest.raises(SpecError, match="smaller than one replica per job"):
        load_spec(p, kind="Service")


def test_cli_up_rejects_a_bad_config_before_starting_anything(tmp_path) -> None:
    from typer.testing import CliRunner

    from plinth.cli.serve import app

    p = tmp_path / "service.yaml"
    p.write_text("quota: 2\npolicy: aiad\njobs:\n  - {name: a, slo_ms: 10, service_ms: 20}\n")
    res = CliRunner().invoke(app, ["up", str(p), "--duration-s", "1"])
    assert res.exit_code != 0
    assert f"{p}:4: jobs[0]: slo_ms 10 must be above service_ms 20" in str(res.exception)
    res = CliRunner().invoke(app, ["up", str(tmp_path / "missing.yaml")])
    assert "cannot read" in str(res.exception)
