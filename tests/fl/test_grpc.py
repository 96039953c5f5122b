"""Real gRPC on 127.0.0.1: chunked streams, TLS, per-client tokens, separate processes."""

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from plinth.core.errors import PlinthError, SpecError
from plinth.fl.app import ServerSpec, load_app
from plinth.fl.client import ClientRunner
from plinth.fl.server import Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport.grpc import GrpcClient, GrpcTransport, load_tokens, parse_address

APPS = Path(__file__).parent / "apps"


class Step:
    def __init__(self, step):
        self.step = step

    def fit(self, params, config):
        return [p + self.step for p in params], 10, {}

    def evaluate(self, params, config):
        return 0.0, 1, {}


def test_server_and_clients_over_tls_with_tokens_and_many_chunks(tls_files):
    cert, key = (tls_files / "cert.pem").read_bytes(), (tls_files / "key.pem").read_bytes()
    tokens = {"tok-a": "a", "tok-b": "b"}
    transport = GrpcTransport("127.0.0.1:0", tokens=tokens, cert=cert, key=key,
                              chunk_size=64 * 1024)
    addr = f"localhost:{transport.port}"
    x0 = [np.zeros((400, 500), np.float32), np.zeros(10, np.float32)]  # 800 kB: 13 chunks
    threads = []
    counts = {}
    for cid, tok, step in (("a", "tok-a", 1.0), ("b", "tok-b", 3.0)):
        c = GrpcClient(addr, client_id=cid, token=tok, ca=cert, chunk_size=64 * 1024)
        th = threading.Thread(target=lambda c=c, s=step, cid=cid: counts.__setitem__(
            cid, c.serve(ClientRunner(Step(s)).handle)))
        th.start()
        threads.append(th)
    server = Server(make_strategy("fedavg"), transport,
                    ServerSpec(fraction=1.0, min_clients=2, min_available=2,
                               straggler_timeout=60, wait_timeout=60))
    server.initialize(x0)
    try:
        recs = server.run(2)
    finally:
        transport.close()
        for th in threads:
            th.join(30)
    assert [r.updates for r in recs] == [2, 2]
    np.testing.assert_allclose(server.strategy.parameters[0], 4.0)  # two rounds of mean(1, 3)
    assert recs[0].bytes_down > 2 * 800_000 and recs[0].bytes_up > 2 * 800_000
    assert counts == {"a": 4, "b": 4}  # 2 fits + 2 federated evaluations each


def test_wrong_token_and_impersonation_are_refused(tls_files):
    cert, key = (tls_files / "cert.pem").read_bytes(), (tls_files / "key.pem").read_bytes()
    transport = GrpcTransport("127.0.0.1:0", tokens={"tok-a": "a"}, cert=cert, key=key)
    addr = f"127.0.0.1:{transport.port}"
    try:
        with pytest.raises(PlinthError, match="UNAUTHENTICATED"):
            GrpcClient(addr, client_id="a", token="wrong", ca=cert, connect_timeout=10).join()
        with pytest.raises(PlinthError, match="PERMISSION_DENIED"):
            GrpcClient(addr, client_id="b", token="tok-a", ca=cert, connect_timeout=10).join()
        assert GrpcClient(addr, client_id="a", token="tok-a", ca=cert).join()["client_id"] == "a"
    finally:
        transport.close(grace=0)


def test_bad_addresses_and_token_files(tmp_path):
    for bad in ("localhost", "host:port", "h:0", "h:70000", ":80"):
        with pytest.raises(SpecError, match="--server: expected HOST:PORT"):
            parse_address(bad)
    assert parse_address("[::1]:8080") == ("[::1]", 8080)
    f = tmp_path / "tokens"
    f.write_text("# id token\nalice s3cret\nbob\n")
    with pytest.raises(SpecError, match="tokens:3"):
        load_tokens(str(f))


def test_separate_server_and_client_processes(tmp_path, tls_files, free_port):
    (tmp_path / "tokens").write_text("c0 token-zero\nc1 token-one\n")
    app = tmp_path / "app.yaml"
    tiny = (APPS / "tiny.yaml").read_text().replace("code: tiny.py", f"code: {APPS}/tiny.py")
    app.write_text(tiny.replace("straggler_timeout: 120", "straggler_timeout: 60, wait_timeout: 60")
                   + f"transport: {{tokens: tokens, chunk_size: 4096, tls: {{cert: "
                   f"{tls_files}/cert.pem, key: {tls_files}/key.pem, "
                   f"ca: {tls_files}/cert.pem}}}}\n")
    port = free_port
    fl = [sys.executable, "-m", "plinth.cli.main", "fl"]
    out = tmp_path / "r.json"
    server = subprocess.Popen([*fl, "server", str(app), "--address", f"127.0.0.1:{port}",
                               "--json", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    clients = [subprocess.Popen([*fl, "client", str(app), "--server", f"localhost:{port}",
                                 "--cid", str(i), "--clients", "2", "--token", tok],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i, tok in enumerate(["token-zero", "token-one"])]
    try:
        _, s_err = server.communicate(timeout=150)
        c_out = [c.communicate(timeout=60) for c in clients]
    finally:
        for p in (server, *clients):
            if p.poll() is None:
                p.kill()
    assert server.returncode == 0, s_err
    assert all(c.returncode == 0 for c in clients), c_out
    doc = json.loads(out.read_text())
    assert [r["updates"] for r in doc["rounds"]] == [2, 2]
    assert doc["final_accuracy"] > 0.5
    assert all("2 tasks done" in o for o, _ in c_out)


def test_client_with_bad_server_address_is_one_line():
    r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "client", str(APPS / "tiny.yaml"),
                        "--server", "nohost"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "--server: expected HOST:PORT" in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_a_client_waits_transport_connect_timeout_for_its_server(tmp_path, free_port):
    """A client started before its server waits for it (a queued task's server may be placed
    minutes later); `transport.connect_timeout` bounds the wait, and a client that gives up
    says which server it waited for in one line."""
    app = tmp_path / "app.yaml"
    app.write_text((APPS / "tiny.yaml").read_text().replace("code: tiny.py",
                                                            f"code: {APPS}/tiny.py")
                   + "transport: {connect_timeout: 3}\n")
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "client", str(app),
                        "--server", f"127.0.0.1:{free_port}"],
                       capture_output=True, text=True, timeout=120, check=False)
    waited = time.monotonic() - start
    assert r.returncode != 0 and f"cannot join 127.0.0.1:{free_port}: DEADLINE_EXCEEDED" \
        in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert waited >= 3, waited  # it waited its connect_timeout, not less
    assert load_app(app).transport.connect_timeout == 3
    default = load_app(APPS / "tiny.yaml").transport.connect_timeout
    assert default >= 120, default  # the default outlasts a unit's start on a busy cluster


@contextlib.contextmanager
def _fleet(port: int, handlers: dict) -> Iterator[None]:
    """A real gRPC server on 127.0.0.1:`port` that answers the fleet's methods with
    `handlers` (name -> grpc method handler): a server that misbehaves on purpose."""
    server = grpc.server(ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "plinth.fl.Fleet", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield
    finally:
        server.stop(0)


def _joined(calls: list, fail: Callable[[], bool] = lambda: False):
    def join(request: bytes, context: grpc.ServicerContext) -> bytes:
        calls.append(json.loads(request)["client_id"])
        if fail():
            context.abort(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")
        return json.dumps({"client_id": calls[-1], "chunk_size": 1024}).encode()
    return grpc.unary_unary_rpc_method_handler(join)


def test_a_join_that_breaks_as_its_server_goes_away_is_tried_again(free_port):
    """A Join sent down a connection that breaks (the server was killed as the client
    rejoined it) fails at once with UNAVAILABLE, even while waiting for the server. The
    client tries again until its connect_timeout instead of leaving the task for good."""
    calls: list[str] = []
    fail_always = threading.Event()
    with _fleet(free_port, {"Join": _joined(calls, lambda: len(calls) == 1
                                                  or fail_always.is_set())}):
        client = GrpcClient(f"127.0.0.1:{free_port}", client_id="c0", connect_timeout=5)
        assert client.join()["client_id"] == "c0"
        assert calls == ["c0", "c0"]
        fail_always.set()  # a server that never takes it: given up after connect_timeout
        client.connect_timeout = 1
        with pytest.raises(PlinthError, match="cannot join .*UNAVAILABLE"):
            client.join()
        assert len(calls) > 3


@pytest.mark.parametrize("broken", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN])
def test_a_task_stream_that_breaks_off_makes_the_client_join_again(free_port, broken):
    """A Pull stream cut by a dying server may end INTERNAL or UNKNOWN rather than
    UNAVAILABLE: the client joins again and goes on, as for any server that went away. A
    refusal (a token the server does not know) still ends it."""
    joins: list[str] = []
    pulls = []

    def pull(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        pulls.append(1)
        if len(pulls) == 1:
            context.abort(broken, "Received RST_STREAM with error code 2")
        yield json.dumps({"shutdown": True}).encode()

    with _fleet(free_port, {"Join": _joined(joins),
                            "Pull": grpc.unary_stream_rpc_method_handler(pull)}):
        client = GrpcClient(f"127.0.0.1:{free_port}", client_id="c0", connect_timeout=5)
        assert client.serve(lambda payload: payload) == 0
    assert joins == ["c0", "c0"] and len(pulls) == 2

    def refuse(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown or missing client token")
        yield b""

    with _fleet(free_port, {"Join": _joined([]),
                            "Pull": grpc.unary_stream_rpc_method_handler(refuse)}):
        client = GrpcClient(f"127.0.0.1:{free_port}", client_id="c0", connect_timeout=5)
        with pytest.raises(PlinthError, match="lost .*UNAUTHENTICATED"):
            client.serve(lambda payload: payload)


def test_killed_grpc_server_resumes_and_clients_rejoin(tmp_path, free_port):
    app = tmp_path / "app.yaml"
    app.write_text((APPS / "tiny.yaml").read_text().replace("code: tiny.py",
                                                            f"code: {APPS}/tiny.py"))
    fl = [sys.executable, "-m", "plinth.cli.main", "fl"]
    addr = f"127.0.0.1:{free_port}"
    ck = tmp_path / "ck"

    def last_round():
        try:
            with sqlite3.connect(ck / "meta.sqlite") as c:
                return c.execute("SELECT max(round) FROM rounds").fetchone()[0] or 0
        except sqlite3.Error:
            return 0

    server = subprocess.Popen([*fl, "server", str(app), "--address", addr, "--rounds", "500",
                               "--checkpoint", str(ck), "--no-tokens"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    clients = [subprocess.Popen([*fl, "client", str(app), "--server", addr, "--cid", str(i),
                                 "--clients", "2"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        deadline = time.monotonic() + 120
        while last_round() < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        k = last_round()
        assert 2 <= k < 500
        out = tmp_path / "r.json"
        again = subprocess.run([*fl, "server", str(app), "--address", addr, "--rounds",
                                str(k + 2), "--checkpoint", str(ck), "--resume", "--json",
                                str(out), "--no-tokens"], capture_output=True, text=True, timeout=120,
                               check=False)
        c_out = [c.communicate(timeout=60) for c in clients]
    finally:
        for p in clients:
            if p.poll() is None:
                p.kill()
    assert again.returncode == 0, again.stderr
    ran = [line.split()[1] for line in again.stdout.splitlines() if line.startswith("round ")]
    assert ran == [str(k + 1), str(k + 2)]
    doc = json.loads(out.read_text())
    assert [r["round"] for r in doc["rounds"]] == list(range(1, k + 3))
    assert all(c.returncode == 0 for c in clients), c_out
