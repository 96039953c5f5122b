"""The one driver (plinth.sched.driver): a turn steps the owner and carries out its output
through the runtime protocol, here on the simulated runtime and a virtual clock."""

from __future__ import annotations

import threading

from plinth.core.clock import VirtualClock
from plinth.core.lifecycle import State
from plinth.core.resources import Cluster, Node, Request
from plinth.core.runtime import LaunchSpec, WorkerLaunch, worker_launches
from plinth.core.throughput import FIXED_SPEED
from plinth.core.workload import Job
from plinth.runtime.sim import SimRuntime
from plinth.sched.driver import Driver, Pacer
from plinth.sched.events import Cancelled, Launch, Output, Submitted
from plinth.sched.owner import Owner
from plinth.sched.policies import make_policy
from plinth.sched.types import SchedConfig

CLUSTER = Cluster((Node("n0", 64_000, 256_000, "V100", 4),))
CFG = SchedConfig(min_runtime=0.0)


def job(jid: int, duration: float = 100.0, gpus: int = 1) -> Job:
    return Job(jid, 0.0, duration, Request(gpus=gpus), job_type=FIXED_SPEED)


class Rig:
    """An owner, the simulated runtime and a driver on one virtual clock."""

    def __init__(self, jobs: list[Job], *, pacer: Pacer | None = None,
                 bad: frozenset[int] = frozenset()) -> None:
        self.clock = VirtualClock()
        self.jobs = {j.id: j for j in jobs}
        self.owner = Owner(CLUSTER, make_policy("fifo"), CFG, validate=True)
        self.runtime = SimRuntime(CLUSTER, CFG.work_model(CLUSTER), self.jobs, clock=self.clock)
        self.outputs: list[Output] = []
        self.bad = bad  # jobs whose LaunchSpec names a node the cluster lacks

        def spec(ins: Launch) -> LaunchSpec:
            workers = worker_launches(CLUSTER, ins.allocation, self.jobs[ins.job_id].request)
            if ins.job_id in self.bad:
                workers = (WorkerLaunch(0, "elsewhere"),)
            return LaunchSpec(ins.job_id, ins.attempt, (), workers, "")

        self.driver = Driver(self.owner, self.runtime, clock=self.clock, launch_spec=spec,
                             grace_s=10.0, record=self.outputs.append, pacer=pacer)

    def run(self) -> None:
        """Turn at every time the driver names until nothing is left."""
        while (t := self.driver.next_time()) is not None:
            self.clock.to(max(t, self.clock()))
            self.driver.step()


def test_a_turn_launches_records_and_hears_the_end():
    rig = Rig([job(1), job(2, 50.0)])
    rig.driver.step([Submitted(j) for j in rig.jobs.values()])
    assert {js.status for js in rig.owner.jobs.values()} == {State.RUNNING}
    assert rig.runtime.next_time() == 50.0  # launched through the protocol
    rig.run()
    assert [(js.id, js.status, js.end_time) for js in rig.owner.jobs.values()] == [
        (1, State.SUCCEEDED, 100.0), (2, State.SUCCEEDED, 50.0)]
    moves = [(t.job_id, t.new) for out in rig.outputs for t in out.transitions]
    assert moves == [(1, State.RUNNING), (2, State.RUNNING), (2, State.SUCCEEDED),
                     (1, State.SUCCEEDED)]  # every output recorded, in order


def test_a_launch_that_fails_fails_its_job_alone():
    rig = Rig([job(1), job(2)], bad={1})
    rig.driver.step([Submitted(j) for j in rig.jobs.values()])
    assert rig.owner.jobs[1].status is State.FAILED
    assert "elsewhere" in rig.owner.jobs[1].reason
    assert rig.owner.jobs[2].status is State.RUNNING


def test_a_pacer_puts_a_pass_off_and_the_driver_comes_back_for_it():
    now = [0.0]  # the pacer's monotonic clock
    rig = Rig([job(1, gpus=2), job(2, 10.0)], pacer=Pacer(1.0, clock=lambda: now[0]))
    rig.driver.step([Submitted(rig.jobs[1])])
    assert rig.owner.passes == 1 and rig.driver.deferred is None
    rig.clock.to(0.25)
    now[0] = 0.25
    rig.driver.step([Submitted(rig.jobs[2])])  # too soon after the last pass
    assert rig.owner.passes == 1 and rig.driver.deferred == 0.25 + 0.75
    assert rig.driver.next_time() == 1.0
    rig.clock.to(1.0)
    now[0] = 1.0
    rig.driver.step()
    assert rig.owner.passes == 2 and rig.driver.deferred is None
    assert rig.owner.jobs[2].status is State.RUNNING and rig.owner.jobs[2].start_time == 1.0
    # Nothing to do: no pass, nothing put off, so nothing to come back for.
    now[0] = 3.0
    rig.driver.step()
    assert rig.owner.passes == 2 and rig.driver.deferred is None
    assert rig.driver.next_time() == rig.runtime.next_time() == 11.0


class GatedRuntime(SimRuntime):
    """The simulated runtime whose launches take as long as a test says (Ray's take seconds),
    and may run several at once."""

    capabilities = SimRuntime.capabilities | {"concurrent-launch"}

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.gate = threading.Event()
        self.stops: list[tuple[int, int]] = []

    def launch(self, spec: LaunchSpec):
        assert self.gate.wait(30), "the test never opened the gate"
        return super().launch(spec)

    def stop(self, job_id: int, attempt: int, grace_s: float, *, checkpoint: bool = False):
        self.stops.append((job_id, attempt))
        super().stop(job_id, attempt, grace_s, checkpoint=checkpoint)


def _gated_rig(jobs: list[Job]) -> tuple[Rig, GatedRuntime, threading.Event]:
    rig = Rig(jobs)
    rt = GatedRuntime(CLUSTER, CFG.work_model(CLUSTER), rig.jobs, clock=rig.clock)
    woke = threading.Event()
    rig.runtime = rt
    rig.driver = Driver(rig.owner, rt, clock=rig.clock, launch_spec=rig.driver.launch_spec,
                        grace_s=10.0, record=rig.outputs.append, wake=woke.set)
    return rig, rt, woke


def test_a_turn_does_not_wait_for_launches_and_the_next_takes_their_results():
    rig, rt, woke = _gated_rig([job(1), job(2)])
    rig.driver.step([Submitted(j) for j in rig.jobs.values()])  # returns: the gate is shut
    assert rig.driver.launching == 2
    assert rt.next_time() is None  # nothing has reached the runtime yet
    rt.gate.set()
    assert woke.wait(30)
    while rig.driver.launching:
        rig.driver.step()
        woke.wait(1)
        woke.clear()
    assert rt.next_time() == 100.0  # both launched
    rig.run()
    assert {js.status for js in rig.owner.jobs.values()} == {State.SUCCEEDED}


def test_a_stop_for_a_launch_on_its_way_is_sent_when_it_is_up():
    rig, rt, woke = _gated_rig([job(1)])
    rig.driver.step([Submitted(rig.jobs[1])])
    rig.driver.step([Cancelled(1, "by the test")])  # its launch is still on its way
    assert rt.stops == []
    rt.gate.set()
    assert woke.wait(30)
    while rig.driver.launching:
        rig.driver.step()
    assert rt.stops == [(1, 1)]
    rig.run()
    assert rig.owner.jobs[1].status is State.CANCELLED
