"""A tiny tuning task end to end through the control plane (a `ControlPlane` on a
`LocalRuntime`, in this process): the scheduler places a real RPC tracker, servers and clients
running TVM MetaSchedule at two CPU shares; one server's processes are killed mid-task and the
server is started again."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
from tune_local import LocalPlatform

from plinth.tune.db import RECORDS, listing, model_key, records_for, shard_dir
from plinth.tune.spec import TuneSpec

pytest.importorskip("tvm")
MODEL, SHAPE = "plinth.tune.models:tiny_linear", [1, 64]


def _lines(path) -> int:
    return sum(1 for line in open(path) if line.strip()) if path.exists() else 0


def _kill_unit(home, workload_id: int, unit: str) -> int:
    """SIGKILL every process of a unit (its shim, the server, TVM's worker): found by the
    checkpoint folder the control plane gives the unit. Returns how many were killed."""
    ckpt = str(home / "checkpoints" / f"workload-{workload_id}" / unit)
    victims = [p for p in psutil.process_iter(["environ"])
               if (p.info.get("environ") or {}).get("PLINTH_CHECKPOINT_DIR") == ckpt]
    # and the shims that run them (the shim does not carry the job's environment)
    victims += [p.parent() for p in victims
                if p.parent() and "shim.py" in " ".join(p.parent().cmdline())]
    for p in victims:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(victims)


@pytest.mark.slow
def test_tiny_task_tunes_at_each_share_and_survives_a_dead_server(tmp_path):
    db = tmp_path / "db"
    spec = TuneSpec.model_validate({"model": MODEL, "input_shape": SHAPE, "shares": [1, 2],
                                    "trials": 4, "trials_per_iter": 2, "name": "tiny",
                                    "builder": "inline", "db": str(db)})
    platform = LocalPlatform(tmp_path / "home")
    try:
        wid = platform.submit(spec)
        result = {}
        waiter = threading.Thread(target=lambda: result.update(
            out=platform.wait(wid, timeout_s=900)))
        waiter.start()
        # Once share 2 has its first measured records, kill its only server: the records stay,
        # the server is started again, and the client tunes on with the new one.
        records = shard_dir(db, MODEL, SHAPE, "cpu", 2, 0, 1) / RECORDS
        while waiter.is_alive() and _lines(records) < 1:
            time.sleep(0.2)
        before = _lines(records)
        killed = _kill_unit(platform.home, wid, "server-share-2-0") if waiter.is_alive() else 0
        waiter.join()
        status = platform.status(wid)
    finally:
        platform.close()
    out = result["out"]
    assert out.state == "succeeded", out
    assert killed >= 2, "the server ended before it could be killed"  # the shim and the server
    assert out.starts("server-share-2-0") == 2 and out.starts("client-share-2-0") == 1
    assert {"tracker", "server-share-1-0", "client-share-1-0"} <= set(out.units)
    assert all(js[-1]["state"] in ("succeeded", "cancelled") for js in out.units.values())
    assert _lines(records) >= before >= 1
    # Where the tracker and servers listened, and what the clients tuned, came as reports.
    assert {u: a["address"].split(":")[0] for u, a in status["addresses"].items()} == {
        u: "127.0.0.1" for u in ("tracker", "server-share-1-0", "server-share-2-0")}
    assert status["addresses"]["server-share-2-0"]["attempt"] == 2  # from its restart
    assert set(status["results"]) == {"client-share-1-0", "client-share-2-0"}
    assert all(r["tasks"] == 1 and r["records"] >= 1 for r in status["results"].values())

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
