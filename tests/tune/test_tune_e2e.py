"""A tiny tuning task end to end on loopback: a real RPC tracker, servers and clients running
TVM MetaSchedule, at two CPU shares; one server is killed mid-task and replaced."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from tune_launch import Launcher

from plinth.tune.db import RECORDS, listing, model_key, records_for, shard_dir
from plinth.tune.run import tune
from plinth.tune.spec import TuneSpec

pytest.importorskip("tvm")
MODEL, SHAPE = "plinth.tune.models:tiny_linear", [1, 64]


def _lines(path) -> int:
    return sum(1 for line in open(path) if line.strip()) if path.exists() else 0


@pytest.mark.slow
def test_tiny_task_tunes_at_each_share_and_survives_a_dead_server(tmp_path):
    spec = TuneSpec.model_validate({"model": MODEL, "input_shape": SHAPE, "shares": [1, 2],
                                    "trials": 4, "trials_per_iter": 2, "name": "tiny",
                                    "builder": "inline"})
    db = tmp_path / "db"
    launcher = Launcher(tmp_path / "logs")
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        out=tune(spec, db, launch=launcher, timeout_s=600, tick_s=0.2)))
    worker.start()
    # Once share 2 has its first measured records, kill its only server: the records stay,
    # the controller replaces the server, and the client tunes on with the new one.
    records = shard_dir(db, MODEL, SHAPE, "cpu", 2, 0, 1) / RECORDS
    while worker.is_alive() and _lines(records) < 1:
        time.sleep(0.2)
    before = _lines(records)
    if worker.is_alive():
        launcher.procs["server-share-2-0"].kill()
    worker.join()
    out = result["out"]
    assert out.state.value == "succeeded", out
    assert out.starts["server-share-2-0"] == 2 and out.starts["client-share-2-0"] == 1
    assert _lines(records) >= before >= 1

    tuned = {(e.model, e.share): e for e in listing(db)}
    key = model_key(MODEL, SHAPE)
    assert set(tuned) == {(key, 1.0), (key, 2.0)}
    assert all(e.records >= 1 and e.tasks == 1 for e in tuned.values())

    # A replica at a share runs the records tuned at the nearest share.
    assert records_for(db, MODEL, "cpu", 1.4, input_shape=SHAPE).share == 1.0
    assert records_for(db, MODEL, "cpu", 1.6, input_shape=SHAPE).share == 2.0
    assert records_for(db, MODEL, "cpu", 64, input_shape=SHAPE).share == 2.0
    assert records_for(db, MODEL, "cuda", 50, input_shape=SHAPE) is None

    import tvm
    from tvm import relax

    from plinth.tune.build import build
    from plinth.tune.model import example_input

    ex, at = build(db, MODEL, SHAPE, "cpu", 2)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](
        tvm.runtime.tensor(example_input(SHAPE))).numpy()
    assert at == 2.0 and got.shape == (1, 64) and np.isfinite(got).all()
