"""A runtime whose launches wait on a cluster (Ray: a placement group and an actor per worker,
seconds each) gets a batch's launches at once, so the control loop waits for the slowest launch,
not for their sum."""

from __future__ import annotations

import threading
import time

from plinth.control.service import ControlPlane
from plinth.core.jobspec import JobSpec, Resources
from plinth.control.store import Store
from plinth.core.runtime import Handle, LaunchSpec
from plinth.runtime.local import LocalRuntime

BATCH = 4


class _Gathered(LocalRuntime):
    """The local runtime, declaring "concurrent-launch"; each launch of a job in `gathered`
    first waits until BATCH of them are under way at once (a serial caller would break the
    barrier after its timeout, and every one of them would fail)."""

    capabilities = LocalRuntime.capabilities | {"concurrent-launch"}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.barrier = threading.Barrier(BATCH, timeout=20)
        self.threads: set[str] = set()
        self.gathered: set[int] = set()

    def launch(self, spec: LaunchSpec) -> Handle:
        if spec.job_id in self.gathered:
            self.threads.add(threading.current_thread().name)
            self.barrier.wait()
        return super().launch(spec)


def test_a_batchs_launches_run_at_once_and_a_failed_one_fails_alone(tmp_path) -> None:
    store = Store(str(tmp_path / "plinth.db"))
    store.put_tenant("default", None, None)
    runtime = _Gathered(tmp_path / "runtime", fake_gpus=f"{BATCH}xA100")
    cp = ControlPlane(store, runtime, home=tmp_path)
    # (this machine may have 2 CPUs: a small share each, so that all four fit at once)
    good = JobSpec(name="good", command=["true"],
                   resources=Resources(gpus=1, cpus=0.1, memory=64))
    # Built without the submit checks, so that it fails in the runtime's launch.
    bad = JobSpec.model_construct(**{**good.__dict__, "env": {"A=B": "x"}, "name": "bad"})
    cp.start()
    try:
        # The cluster is held by a job that ends when told, so that the four start in one pass.
        go = tmp_path / "go"
        holder = cp.submit(JobSpec(name="holder", resources=Resources(gpus=BATCH, cpus=0.1, memory=64), command=[
            "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"]), "default")
        _wait(lambda: store.job(holder)["state"] == "running")
        ids = [cp.submit(s, "default") for s in (good, bad, good, good)]
        runtime.gathered.update(ids)
        go.touch()
        _wait(lambda: all((store.job(i) or {}).get("end_time") for i in ids))
        states = [store.job(i)["state"] for i in ids]
        assert states == ["succeeded", "failed", "succeeded", "succeeded"], \
            [store.job(i)["reason"] for i in ids]
        assert "illegal environment variable" in store.job(ids[1])["reason"]
        assert len(runtime.threads) == BATCH and not runtime.barrier.broken
        assert all(t.startswith("plinth-launch") for t in runtime.threads)
        assert cp.node_usage()[0]["gpus_used"] == 0
    finally:
        cp.close()


def _wait(done, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
