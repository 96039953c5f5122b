"""A replica serving the user's own model: every form of model reference, the one-line errors of
the submit-time check (each provoked for real), a replica process fed bad bodies and then good
ones, and registration with a real HTTP server that checks the bearer secret."""

from __future__ import annotations

import io
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import uvicorn
from fastapi import FastAPI, Request, Response
from replica_process import ReplicaProcess

import plinth.control.kinds  # noqa: F401  # registers the kinds that load_spec reads
from plinth.core.errors import PlinthError, SpecError
from plinth.serve.check import check_model, check_model_here
from plinth.serve.model import forward_fn, load_handler, load_model
from plinth.serve.replica import NPY

ROOT = str(Path(__file__).resolve().parents[2])
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
CNN = ["--model", "examples.serve.cnn:make", "--input-shape", "1,28,28", "--workdir", ROOT]


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _error(check=check_model_here, **kw) -> str:
    with pytest.raises(SpecError) as e:
        check(**kw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# --- loading and checking ----------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_every_kind_of_model_reference_loads_the_same_model(tmp_path) -> None:
    net = load_model("examples.serve.cnn:make", workdir=ROOT)
    x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    want = forward_fn(net)(x)
    torch.jit.script(net).save(str(tmp_path / "cnn.ts"))
    batch = torch.export.Dim("batch", max=1024)
    ep = torch.export.export(net, (torch.zeros(2, 1, 28, 28),), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(tmp_path / "cnn.pt2"))
    for ref in ("cnn.ts", str(tmp_path / "cnn.pt2")):
        got = forward_fn(load_model(ref, workdir=str(tmp_path)))(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    a, b = load_model("tiny-cnn"), load_model("tiny-cnn")  # built-ins are seeded
    x = torch.ones(2, 784)
    torch.testing.assert_close(forward_fn(a)(x), forward_fn(b)(x))
    assert check_model_here("examples.serve.cnn:make", (1, 28, 28), 1e6, ROOT) > 0


def test_check_model_errors_name_the_field(tmp_path) -> None:
    (tmp_path / "userfactories.py").write_text(
        "import torch\n"
        "def bad():\n    raise ValueError('width must be even')\n"
        "def number():\n    return 3\n"
        "def pair():\n    return PairNet()\n"
        "class PairNet(torch.nn.Module):\n"
        "    def forward(self, x):\n        return x, x\n")
    (tmp_path / "junk.pt").write_text("not a model")
    wd = str(tmp_path)
    assert _error(ref="x.pt", input_shape=(1,), slo_ms=10, workdir=wd) == (
        "model: no such file 'x.pt'")
    assert _error(ref="userfactories:bad", input_shape=(1,), slo_ms=10, workdir=wd) == (
        "model: factory userfactories:bad raised ValueError: width must be even")
    assert _error(ref="userfactories:number", input_shape=(1,), slo_ms=10, workdir=wd) == (
        "model: factory userfactories:number returned int, not a torch.nn.Module")
    assert _error(ref="userfactories:nope", input_shape=(1,), slo_ms=10, workdir=wd) == (
        "model: userfactories has no attribute 'nope'")
    assert _error(ref="no_such_module_here:make", input_shape=(1,), slo_ms=10,
                  workdir=wd).startswith("model: cannot import no_such_module_here: "
                                         "ModuleNotFoundError")
    assert _error(ref="userfactories:pair", input_shape=(4,), slo_ms=10, workdir=wd) == (
        "model: the model returned tuple, not a torch.Tensor")
    assert _error(ref="junk.pt", input_shape=(1,), slo_ms=10, workdir=wd).startswith(
        "model: cannot load 'junk.pt' as a TorchScript file: RuntimeError: ")
    assert _error(ref="gpt-9", input_shape=(1,), slo_ms=10, workdir=wd).startswith(
        "model: 'gpt-9' is not a built-in model (tiny-cnn, mlp)")
    assert _error(ref="examples.serve.cnn:make", input_shape=(3, 32, 32), slo_ms=10,
                  workdir=ROOT).startswith(
        "input_shape: the model refused an input of shape (1, 3, 32, 32): RuntimeError: ")
    msg = _error(ref="examples.serve.cnn:make", input_shape=(1, 28, 28), slo_ms=1e-6,
                 workdir=ROOT)
    assert msg.startswith("slo_ms: 1e-06 ms is below the model's measured single-request "
                          "latency ") and msg.endswith(" ms")


def test_check_model_runs_the_users_code_in_a_child_process(tmp_path) -> None:
    (tmp_path / "model.py").write_text(
        "import os, sys, time\n"
        "def secret():\n    raise ValueError(os.environ.get('PLINTH_REPLICA_SECRET', 'unset'))\n"
        "def leave():\n    sys.exit(3)\n"
        "def hang():\n    time.sleep(600)\n")
    wd = str(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.py").write_text("import torch\ndef ok():\n    return torch.nn.Linear(1, 1)\n")
    # The caller (as the control plane would) has imported another service's `model` module.
    load_model("model:ok", workdir=str(other))
    os.environ["PLINTH_REPLICA_SECRET"] = "hidden"
    try:  # the child imports this workdir's own `model`, without the caller's secrets
        assert _error(check_model, ref="model:secret", input_shape=(1,), slo_ms=10,
                      workdir=wd) == "model: factory model:secret raised ValueError: unset"
    finally:
        del os.environ["PLINTH_REPLICA_SECRET"]
        sys.modules.pop("model", None)
        sys.path.remove(str(other.resolve()))
    assert _error(check_model, ref="model:leave", input_shape=(1,), slo_ms=10,
                  workdir=wd).startswith("model: the check exited with 3")
    assert _error(check_model, ref="model:hang", input_shape=(1,), slo_ms=10, workdir=wd,
                  timeout_s=10) == ("model: loading it and running one example took over 10 s")
    assert _error(check_model, ref="m:make", input_shape=(1,), slo_ms=10,
                  workdir=str(tmp_path / "nope")) == (
        f"workdir: no such directory {str(tmp_path / 'nope')!r}")
    assert check_model("examples.serve.cnn:make", [1, 28, 28], 1e6, ROOT) > 0


def test_the_example_service_is_submitted_from_any_folder(tmp_path, monkeypatch) -> None:
    """Its `workdir: ../..` is the repo's root whatever the current folder, so its MODULE
    imports and is timed; without it the module is looked up where you submit and fails."""
    from plinth.core.spec import load_spec

    example = Path(ROOT) / "examples" / "serve" / "service.yaml"
    monkeypatch.chdir(tmp_path)
    spec = load_spec(example).submitted(example.parent)
    assert spec.workdir == ROOT and spec.service_ms > 0
    with pytest.raises(SpecError, match="^model: cannot import examples.serve.cnn"):
        load_spec(example).model_copy(update={"workdir": None}).submitted(example.parent)


def test_handler_references_are_checked() -> None:
    h = load_handler("examples.serve.handler:Handler", workdir=ROOT)
    x = h.preprocess({"images": [[[0] * 28] * 28]})
    assert tuple(x.shape) == (1, 1, 28, 28)
    out = h.postprocess(torch.tensor([[0.0] * 9 + [5.0]]))
    assert out["labels"] == ["ankle boot"]
    with pytest.raises(SpecError, match="^handler: examples.serve.handler has no attribute 'X'$"):
        load_handler("examples.serve.handler:X", workdir=ROOT)
    with pytest.raises(SpecError, match="^handler: examples.serve.cnn:make has no preprocess"):
        load_handler("examples.serve.cnn:make", workdir=ROOT)
    with pytest.raises(SpecError, match="^handler: expected MODULE:NAME"):
        load_handler("handler.py")


# --- a replica process --------------------------------------------------------------------------


def test_bad_bodies_are_400s_and_the_replica_keeps_serving() -> None:
    args = [*CNN, "--handler", "examples.serve.handler:Handler", "--slo-ms", "1000"]
    images = np.random.default_rng(0).integers(0, 256, (2, 28, 28)).tolist()
    strings = _npy(np.array(["a", "b"]))
    bad = [
        ({"content": b"{not json"}, "body: not JSON"),
        ({"json": {"inputs": [1, 2]}}, "images: expected"),
        ({"json": {"images": [[1, 2], [3]]}}, "images: not a list of 28x28"),
        ({"json": {"images": [[[0] * 27] * 28]}}, "images: expected N images of 28x28"),
        ({"content": b"garbage", "headers": {"content-type": NPY}}, "body: not a .npy array"),
        ({"content": _npy(np.zeros((2, 784), np.float32)), "headers": {"content-type": NPY}},
         "body: expected a batch of shape (N, 1, 28, 28), got (2, 784)"),
        ({"content": _npy(np.zeros((1, 28, 28), np.float32)), "headers": {"content-type": NPY}},
         "got (1, 28, 28)"),
        ({"content": strings, "headers": {"content-type": NPY}}, "expected a numeric array"),
        ({"content": b"", "headers": {"content-type": NPY}}, "body: not a .npy array"),
    ]
    with ReplicaProcess.start(args, env=ENV, cwd=ROOT) as rp, httpx.Client(timeout=60) as c:
        assert c.get(rp.url + "/healthz").status_code == 200
        for kw, reason in bad:
            r = c.post(rp.url + "/infer", **kw)
            assert r.status_code == 400, (kw, r.text)
            assert reason in r.json()["error"], (reason, r.text)
        good = c.post(rp.url + "/infer", json={"images": images})
        assert good.status_code == 200
        # Server-Timing: the replica's own time, which a client sets against its latency.
        name, dur = good.headers["server-timing"].split(";dur=")
        assert name == "replica" and 0 < float(dur) < good.elapsed.total_seconds() * 1000
        labels = good.json()["labels"]
        x = np.random.default_rng(1).random((3, 1, 28, 28), dtype=np.float32)
        raw = c.post(rp.url + "/infer", content=_npy(x), headers={"content-type": NPY})
        assert raw.status_code == 200 and raw.headers["content-type"] == NPY
        stats = c.get(rp.url + "/stats").json()
        assert rp.stop() == 0
    assert stats["requests"] == 2 and stats["failed"] == 0
    from examples.serve.handler import LABELS, Handler

    forward = forward_fn(load_model("examples.serve.cnn:make", workdir=ROOT))
    h = Handler()
    assert labels == h.postprocess(forward(h.preprocess({"images": images})))["labels"]
    assert set(labels) <= set(LABELS)
    np.testing.assert_allclose(np.load(io.BytesIO(raw.content)),
                               forward(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)


def test_a_replica_that_cannot_serve_exits_with_the_reason() -> None:
    args = ["--model", "examples.serve.cnn:make", "--input-shape", "3,32,32", "--slo-ms", "100",
            "--workdir", ROOT]
    with pytest.raises(PlinthError, match=r"exit 2\): replica: input_shape: the model refused "
                                          r"an input of shape \(1, 3, 32, 32\)"):
        ReplicaProcess.start(args, env=ENV, cwd=ROOT)


# --- registration -------------------------------------------------------------------------------


class _Registry:
    """A tiny router stand-in: records each POST and answers 401 to a wrong secret."""

    def __init__(self, secret: str) -> None:
        self.events: list[tuple[str, dict, bool]] = []
        self.app = FastAPI()

        async def record(kind: str, request: Request) -> Response:
            ok = request.headers.get("authorization") == f"Bearer {secret}"
            self.events.append((kind, await request.json(), ok))
            return Response(status_code=200 if ok else 401)

        @self.app.post("/replicas")
        async def join(request: Request) -> Response:
            return await record("join", request)

        @self.app.post("/replicas/leave")
        async def leave(request: Request) -> Response:
            return await record("leave", request)


@pytest.fixture
def registry() -> Iterator[tuple[_Registry, str]]:
    reg = _Registry("s3cret")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(reg.app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield reg, f"http://127.0.0.1:{sock.getsockname()[1]}/replicas"
    server.should_exit = True
    thread.join(10)


def _wait_for(cond, what: str, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s  # a bound on a hang, not a timing assert
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"never saw {what}")
        time.sleep(0.05)


def test_registers_heartbeats_and_leaves_on_sigterm(registry) -> None:
    reg, url = registry
    env = dict(ENV, PLINTH_REPLICA_SECRET="s3cret")
    args = ["--model", "mlp", "--input-shape", "784", "--slo-ms", "100", "--register", url,
            "--unit", "svc-0"]
    with ReplicaProcess.start(args, env=env) as rp:
        _wait_for(lambda: len(reg.events) >= 2, "two heartbeats")
        assert httpx.post(rp.url + "/infer", json={"inputs": [[0.0] * 784]}).status_code == 200
        assert rp.stop() == 0
    body = {"unit": "svc-0", "url": rp.url}  # and its measured one-request time
    assert all(b.pop("service_ms") > 0 for _, b, _ in reg.events)
    assert all(ok for _, _, ok in reg.events)  # every POST carried the bearer secret
    assert all(b == body for _, b, _ in reg.events)
    kinds = [k for k, _, _ in reg.events]
    assert kinds[-1] == "leave" and kinds.count("leave") == 1 and kinds[0] == "join"


def test_a_wrong_secret_or_an_absent_router_does_not_stop_the_replica(registry) -> None:
    reg, url = registry
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    dead = f"http://127.0.0.1:{closed.getsockname()[1]}/replicas"
    for target, secret in ((url, "wrong"), (dead, "s3cret")):
        env = dict(ENV, PLINTH_REPLICA_SECRET=secret)
        args = ["--model", "mlp", "--input-shape", "784", "--slo-ms", "100", "--register",
                target]
        with ReplicaProcess.start(args, env=env) as rp:
            if target == url:
                _wait_for(lambda: reg.events, "a heartbeat")
            r = httpx.post(rp.url + "/infer", json={"inputs": [[0.0] * 784]})
            assert r.status_code == 200
            assert rp.stop() == 0
    closed.close()
    assert reg.events and not any(ok for _, _, ok in reg.events)


def test_sigterm_finishes_the_requests_the_replica_holds() -> None:
    # A batch of 8 that never fills and a wait past the test: the requests are still queued
    # when SIGTERM comes, and must be answered, not dropped.
    args = ["--model", "mlp", "--input-shape", "784", "--slo-ms", "1e9", "--max-batch", "8",
            "--max-wait-ms", "1e8"]
    with ReplicaProcess.start(args, env=ENV) as rp:
        results: list[int] = []

        def call() -> None:
            r = httpx.post(rp.url + "/infer", json={"inputs": [[1.0] * 784]}, timeout=60)
            results.append(r.status_code)

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        _wait_for(lambda: httpx.get(rp.url + "/stats").json()["queued"] == 3, "3 queued")
        assert rp.stop() == 0
        for t in threads:
            t.join(60)
    assert results == [200, 200, 200]
