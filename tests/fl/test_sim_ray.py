"""`plinth fl sim --backend ray`: virtual clients as Ray actors on a real local Ray (one for
the module, as a notebook's ray.init would be; the CLI's private Ray in the GPU test): the
same rounds as the process pool, SecAgg+ on sticky actors, a dead actor replaced, one-line
errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from plinth.core.errors import PlinthError
from plinth.core.net import free_port
from plinth.fl.sim import run_sim

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]
APPS = Path(__file__).parent / "apps"
TINY = str(APPS / "tiny.yaml")
TEST_SET = 359  # digits: the test split's size, so one test image is 1/359 of accuracy


@pytest.fixture(scope="module")
def cluster():
    """A local Ray of 4 CPUs and no GPUs for the module, stopped at the end."""
    pytest.importorskip("ray")
    from plinth.runtime.pool import ray_session

    with ray_session(None, num_cpus=4) as ray:
        yield ray


def _connected() -> bool:
    import ray

    return ray.is_initialized()


def test_ray_actors_give_the_pool_accuracy_in_every_round(cluster):
    pool = run_sim(TINY, clients=4, rounds=3, workers=1)
    on_ray = run_sim(TINY, clients=4, rounds=3, workers=2, backend="ray")
    assert _connected()  # the Ray it found is not its own to stop
    assert [r["updates"] for r in on_ray["rounds"]] == [4, 4, 4]
    assert [r["failures"] for r in on_ray["rounds"]] == [0, 0, 0]
    for a, b in zip(pool["rounds"], on_ray["rounds"]):
        assert b["bytes_down"] == a["bytes_down"]  # the same model, to the same clients
        assert b["bytes_up"] == pytest.approx(a["bytes_up"], rel=0.01)
        # the clients' training is seeded by client id; only the order in which the server
        # adds the updates may differ (float sums), far below one test image
        assert abs(a["accuracy"] - b["accuracy"]) < 1 / TEST_SET
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    accs = [r["accuracy"] for r in on_ray["rounds"]]
    assert accs[-1] > accs[0]  # it learns


def test_secagg_runs_on_sticky_actors(cluster):
    # SecAgg+ keeps each client's keys in its actor's memory between the stages (sticky actors,
    # tested directly below): the whole protocol runs, every client survives
    r = run_sim(TINY, clients=4, rounds=2, workers=2, backend="ray", overrides={
        "server.fraction": 1.0, "privacy": {"secagg": {"threshold": 0.5}}})
    assert r["secagg"] is True
    assert [x["secagg_survivors"] for x in r["rounds"]] == [4, 4]
    assert [x["failures"] for x in r["rounds"]] == [0, 0]
    assert r["final_accuracy"] > 0.4


PID_APP = """
import os
from torch import nn
from plinth.fl.torch_client import make_default_client


def make_model(spec):
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


class _SaysWhere:
    def __init__(self, inner):
        self.inner = inner

    def fit(self, parameters, config):
        return self.inner.fit(parameters, config)

    def evaluate(self, parameters, config):
        return 0.0, 1, {"pid": os.getpid()}


def make_client(cid, train, test, spec):
    return _SaysWhere(make_default_client(make_model(spec), train, test, spec.train, cid))
"""


def test_sticky_actors_serve_each_client_from_one_actor_c_mod_n(cluster, tmp_path):
    from plinth.fl import serde
    from plinth.fl.messages import EvaluateIns
    from plinth.fl.transport.ray import RayTransport

    (tmp_path / "pids.py").write_text(PID_APP)
    app_yaml = tmp_path / "pids.yaml"
    app_yaml.write_text((APPS / "tiny.yaml").read_text().replace("code: tiny.py", "code: pids.py"))
    n, actors = 8, 3
    t = RayTransport(str(app_yaml), {"data.clients": n}, n, [1] * n, actors=actors, sticky=True)
    try:
        payload = serde.encode(EvaluateIns(1, [], {}))
        served: dict[int, set[float]] = {c: set() for c in range(n)}
        for _ in range(3):  # three stages, each sent to all clients at once
            futures = {c: t.submit(str(c), payload) for c in range(n)}
            for c, f in futures.items():
                served[c].add(serde.decode(f.result(timeout=120)).metrics["pid"])
    finally:
        t.close()
    assert all(len(pids) == 1 for pids in served.values())  # always the same actor
    lane = {k: {served[c].pop() for c in range(k, n, actors)} for k in range(actors)}
    assert all(len(pids) == 1 for pids in lane.values())  # clients c ≡ k (mod 3) share one
    assert len(set().union(*lane.values())) == actors  # and each lane is its own actor


def test_a_client_that_kills_its_actor_is_lost_and_the_actor_replaced(cluster, tmp_path):
    app_yaml = tmp_path / "crashy.yaml"
    app_yaml.write_text((APPS / "tiny.yaml").read_text().replace(
        "code: tiny.py", f"code: {APPS / 'crashy.py'}"))
    r = run_sim(str(app_yaml), clients=3, rounds=2, workers=1, backend="ray")
    first, second = r["rounds"]
    # client 0 took its (only) actor down: it, and whatever else the actor held, are lost
    assert first["failures"] >= 1 and first["updates"] + first["failures"] == 3
    assert second["updates"] == 3 and second["failures"] == 0  # a new actor serves round 2


def test_an_unreachable_ray_address_is_one_line():
    port = free_port()  # nothing listens there
    r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "sim", TINY, "--backend",
                        "ray", "--ray-address", f"127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert f"--ray-address 127.0.0.1:{port}: cannot reach the Ray head" in r.stderr


@pytest.mark.parametrize("kw, says", [
    ({"backend": "spark"}, "--backend: expected one of pool, ray, got 'spark'"),
    ({"client_gpus": 0.5}, "need --backend ray"),
    ({"backend": "ray", "client_cpus": 0.0}, "CPUs must be positive"),
])
def test_bad_backend_options_are_one_line(kw, says):
    with pytest.raises(PlinthError, match=re.escape(says)) as e:
        run_sim(TINY, clients=4, rounds=1, **kw)
    assert "\n" not in str(e.value)


def test_a_gpu_share_on_a_ray_without_gpus_is_one_line(cluster):
    if cluster.cluster_resources().get("GPU", 0):
        pytest.skip("this machine's Ray has GPUs")
    with pytest.raises(PlinthError, match=r"--client-gpus 0.5: the Ray cluster has no GPUs") \
            as e:
        run_sim(TINY, clients=4, rounds=1, backend="ray", client_gpus=0.5)
    assert "\n" not in str(e.value)
