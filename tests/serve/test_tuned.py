"""A Service's tuned model (`tuned: {db, target}`): a tiny model tuned for real at two CPU shares
through a real `plinth up` (`plinth submit` of examples/tune/tiny.yaml with fewer trials, once
for the module: the scheduler places its tracker, servers and clients as jobs, share 2's server
once share 1's is gone on 2 cores), then served by replica processes at share 1 and at share 2
on loopback: each runs the records of its own share, on TVM's Relax VM, and answers as the torch
model does. The bad-input cases of the field are each provoked for real. tests/tune/
test_tune_e2e.py tunes through an in-process control plane, with a server killed mid-task."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import yaml
from filelock import FileLock
from replica_process import ReplicaProcess

import plinth.control.kinds  # noqa: F401  # registers the kinds that load_spec reads
from plinth.core.errors import SpecError
from plinth.core.spec import load_spec
from plinth.serve.check import check_model
from plinth.serve.replica import NPY
from plinth.tune.db import listing, model_key
from plinth.tune.models import tiny_linear

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "control")]
from plinth_platform import (  # a real `plinth up`, and the CLI against it
    Platform,
    reachable,
    run_cli,
)

MODEL = "plinth.tune.models:tiny_linear"
EXAMPLE = TESTS.parent / "examples" / "serve" / "tuned.yaml"
SERVICE = {"kind": "Service", "name": "lin", "model": MODEL, "input_shape": [64],
           "slo_ms": 1000}


def _spec(tmp_path: Path, **over) -> Path:
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump({**SERVICE, **over}))
    return path


def _submit_error(tmp_path: Path, **over) -> str:
    path = _spec(tmp_path, **over)
    with pytest.raises(SpecError) as e:
        load_spec(path).submitted(path.parent)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


TUNE_EXAMPLE = TESTS.parent / "examples" / "tune" / "tiny.yaml"


@dataclass
class Tuned:
    """What one `plinth submit` of the example Tune task left: its database, the workload at
    its end, and what `plinth tune show DB` and `plinth ls --all` printed."""

    db: Path
    workload: dict
    show: str
    ls: str


def _tune(work: Path) -> Tuned:
    doc = yaml.safe_load(TUNE_EXAMPLE.read_text())
    doc |= {"db": str(work / "db"), "trials": 2, "trials_per_iter": 2, "builder": "inline"}
    spec = work / "tune.yaml"
    spec.write_text(yaml.safe_dump(doc))
    p = Platform(work / "home").start()
    try:
        out = run_cli(p, "submit", str(spec))
        assert out.returncode == 0 and "Submitted Tune tiny" in out.stdout, out.stderr
        c = p.client()
        deadline = time.monotonic() + 900
        while c.workload("tiny")["state"] == "active":
            assert time.monotonic() < deadline, "the tuning did not end in 900 s"
            time.sleep(1)  # minutes of tuning: no need to ask the server more often
        show = run_cli(p, "tune", "show", str(work / "db"))
        assert show.returncode == 0, show.stderr
        return Tuned(work / "db", c.workload("tiny"), show.stdout,
                     run_cli(p, "ls", "--all").stdout)
    finally:
        p.stop()
        p.kill_jobs()


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    return reachable(tmp_path)  # as root, the platform's jobs run as its tenants' users


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Tuned:
    """tiny_linear at input [1, 64], tuned at shares 1 and 2 with two trials each, by a Tune
    workload on a real `plinth up`: once for the whole run, whichever xdist worker asks first
    (the others wait on the lock and read what it left)."""
    pytest.importorskip("tvm")
    root = tmp_path_factory.getbasetemp().parent  # shared by the workers of one run
    work, done = root / "tuned", root / "tuned" / "done.json"
    with FileLock(str(root / "tuned.lock")):
        if not done.exists():
            work.mkdir(exist_ok=True)
            reachable(work)  # the Tune workload's units write the database there
            t = _tune(work)
            done.write_text(json.dumps({"workload": t.workload, "show": t.show, "ls": t.ls}))
    got = json.loads(done.read_text())
    return Tuned(work / "db", got["workload"], got["show"], got["ls"])


@pytest.fixture(scope="module")
def tuned_db(tuned) -> Path:
    return tuned.db


@pytest.mark.slow
def test_plinth_submit_tunes_at_two_shares_through_the_scheduler(tuned) -> None:
    w = tuned.workload
    assert w["state"] == "succeeded", w
    assert {u["unit"] for u in w["units"]} == {"tracker", "server-share-1-0", "server-share-2-0",
                                              "client-share-1-0", "client-share-2-0"}
    key = model_key(MODEL, [1, 64])
    assert {(e.model, e.share) for e in listing(tuned.db) if e.records >= 1} == \
        {(key, 1.0), (key, 2.0)}
    assert key in tuned.show
    # `plinth ls` lists the task under the jobs, as it does services and FL tasks
    row = next((ln for ln in tuned.ls.splitlines() if ln.startswith("tiny ")), tuned.ls)
    assert "TUNE" in tuned.ls and "succeeded" in row and "1, 2 cores" in row and "2/2" in row


# --- bad input, no TVM needed ------------------------------------------------------------------


def test_bad_tuned_fields_are_one_line_errors_naming_the_field(tmp_path) -> None:
    (tmp_path / "empty-db").mkdir()
    assert _submit_error(tmp_path, tuned={"db": "nowhere"}) == (
        f"tuned.db: no such folder {str(tmp_path / 'nowhere')!r}")
    msg = _submit_error(tmp_path, tuned={"db": "empty-db"})
    assert msg.startswith(f"tuned.db: {tmp_path / 'empty-db'} has no tuning of {MODEL} at input "
                          f"shape [1, 64]") and msg.endswith("it holds nothing"), msg
    assert _submit_error(tmp_path, model="tiny-cnn", input_shape=[784], tuned={
        "db": "empty-db"}).endswith("tuned: a tuned model is MODULE:FACTORY or a .pt2 file, as "
                                    "a Tune task takes it; model is 'tiny-cnn'")
    assert _submit_error(tmp_path, tuned={"db": "empty-db", "target": "cuda"}).endswith(
        "tuned.target: cuda runs on a GPU share; give the replica a resources.gpu_fraction, "
        "or use target: cpu")
    assert _submit_error(tmp_path, resources={"gpu_fraction": 0.5}, tuned={
        "db": "empty-db"}).endswith("tuned.target: cpu runs on the replica's CPUs, but "
                                    "resources.gpu_fraction 0.5 gives it a GPU share; use "
                                    "target: cuda")
    assert _submit_error(tmp_path, tuned={"db": "empty-db", "share": 2}).endswith(
        "tuned.share: unknown field; allowed fields: db, target")
    assert _submit_error(tmp_path, tuned={"db": "empty-db", "target": "tpu"}).endswith(
        "tuned.target: input should be 'cpu' or 'cuda' (got 'tpu')")
    assert _submit_error(tmp_path, tuned={"db": ""}).endswith(
        "tuned.db: string should have at least 1 character (got '')")


def test_a_replica_share_follows_its_threads_or_its_gpu_share(tmp_path) -> None:
    def share(**over) -> float:
        return load_spec(_spec(tmp_path, **over)).share()
    assert share() == 1.0 and share(resources={"cpus": 2.7}) == 2.0
    assert share(resources={"cpus": 0.5}) == 1.0
    assert share(resources={"cpus": 1}, env={"OMP_NUM_THREADS": "2"}) == 2.0
    assert share(resources={"cpus": 1, "gpu_fraction": 0.25}) == 25.0


# --- tuned for real ----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_submit_check_names_what_is_tuned_and_times_the_build(tuned_db, tmp_path) -> None:
    key = model_key(MODEL, [1, 64])
    assert _submit_error(tmp_path, input_shape=[32], tuned={"db": str(tuned_db)}).endswith(
        f"has no tuning of {MODEL} at input shape [1, 32] (a Tune task's input_shape); it "
        f"holds {key}")
    gpu = {"db": str(tuned_db), "target": "cuda"}
    with pytest.raises(SpecError) as e:  # a GPU share, asked on this CPU-only machine
        check_model(MODEL, [64], 1000, tuned=(gpu["db"], "cuda", 50.0))
    assert str(e.value) == (f"tuned.target: {MODEL} at input shape [1, 64] is not tuned on "
                            f"cuda in {tuned_db}; it is tuned on cpu at shares 1, 2")
    # A relative database is found from the spec's folder, wherever `plinth submit` runs.
    (tmp_path / "spec").mkdir()
    os.symlink(tuned_db, tmp_path / "spec" / "tune-db")
    path = tmp_path / "spec" / "svc.yaml"
    path.write_text(yaml.safe_dump({**SERVICE, "tuned": {"db": "tune-db"}}))
    sent = load_spec(path).submitted(path.parent)
    assert sent.tuned is not None and sent.tuned.db == str(tmp_path / "spec" / "tune-db")
    assert 0 < sent.service_ms < 1000  # the TVM build's own latency, timed in a child


@pytest.mark.slow
def _torch_outputs(x: np.ndarray) -> np.ndarray:
    torch.manual_seed(0)  # the replica seeds its factory so: the same weights
    net = tiny_linear().eval()
    with torch.no_grad():
        return net(torch.from_numpy(x)).numpy()


def test_replicas_serve_the_records_of_their_own_share(tuned_db) -> None:
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    want = _torch_outputs(x)
    args = ["--model", MODEL, "--input-shape", "64", "--slo-ms", "1000",
            "--tuned-db", str(tuned_db)]
    replicas = {}
    try:
        for share in (1, 2):
            env = dict(os.environ, OMP_NUM_THREADS=str(share))
            replicas[share] = ReplicaProcess.start(args, env=env, timeout_s=300)
        for share, rp in replicas.items():
            health = httpx.get(f"{rp.url}/healthz").json()
            assert health["batch_size"] == 1
            assert health["tuned"] == {"db": str(tuned_db), "target": "cpu", "share": share,
                                       "tuned_at": share, "shares": [1.0, 2.0],
                                       "records": health["tuned"]["records"]}
            assert health["tuned"]["records"] >= 1
            r = httpx.post(f"{rp.url}/infer", json={"inputs": x.tolist()}, timeout=30)
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(np.array(r.json()["outputs"]), want, rtol=1e-4,
                                       atol=1e-4)
            buf = io.BytesIO()
            np.save(buf, x[:1])
            r = httpx.post(f"{rp.url}/infer", content=buf.getvalue(),
                           headers={"content-type": NPY}, timeout=30)
            assert r.status_code == 200
            np.testing.assert_allclose(np.load(io.BytesIO(r.content)), want[:1], rtol=1e-4,
                                       atol=1e-4)
            bad = httpx.post(f"{rp.url}/infer", json={"inputs": [[0.0] * 63]}, timeout=30)
            assert bad.status_code == 400 and "(N, 64)" in bad.json()["error"]
    finally:
        for rp in replicas.values():
            rp.close()


@pytest.mark.slow
def test_a_tuned_service_through_plinth_submit_and_the_router(tuned_db, tmp_path) -> None:
    """`plinth submit` of examples/serve/tuned.yaml (its database and CPUs changed) on a real
    `plinth up`: the scheduler places its replica (2 threads: share 2, on 1.5 CPUs, so that it
    fits this 2-CPU machine beside its router's 0.5), which serves the share-2 records behind
    the router, and `plinth show` says so."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc |= {"tuned": {**doc["tuned"], "db": str(tuned_db)}, "max_replicas": 1,
            "resources": {**doc["resources"], "cpus": 1.5}, "env": {"OMP_NUM_THREADS": "2"}}
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(doc))
    name = doc["name"]
    p = Platform(tmp_path / "home", "--serve-tick", "1")
    p.start()
    try:
        out = run_cli(p, "submit", str(path))
        assert out.returncode == 0 and f"Submitted Service {name}" in out.stdout, out.stderr
        c = p.client()
        deadline = time.monotonic() + 300
        while c.workload(name)["status"].get("ready") != 1:
            assert time.monotonic() < deadline, c.workload(name)
            time.sleep(0.5)  # a replica's TVM build takes tens of seconds here
        x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
        r = httpx.post(c.workload(name)["status"]["url"], json={"inputs": x.tolist()},
                       timeout=30)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["outputs"]), _torch_outputs(x),
                                   rtol=1e-4, atol=1e-4)
        show = " ".join(run_cli(p, "show", name).stdout.split())  # unwrapped
        assert "tuned: records tuned at share 2 for replica share 2 (tuned at 1, 2;" in show, show
    finally:
        p.stop()
        p.kill_jobs()
