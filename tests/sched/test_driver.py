"""The one driver (plinth.sched.driver): a turn steps the owner and carries out its output
through the runtime protocol, here on the simulated runtime and a virtual clock."""

from __future__ import annotations

from plinth.core.clock import VirtualClock
from plinth.core.lifecycle import State
from plinth.core.resources import Cluster, Node, Request
from plinth.core.runtime import LaunchSpec, WorkerLaunch, worker_launches
from plinth.core.throughput import FIXED_SPEED
from plinth.core.workload import Job
from plinth.runtime.sim import SimRuntime
from plinth.sched.driver import Driver, Pacer
from plinth.sched.events import Launch, Output, Submitted
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
