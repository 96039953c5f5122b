"""The simulated runtime's behaviours: what a simulated job can act out besides its work, in
virtual time (the contract suite, test_contract.py, runs it against the shared checks too)."""

from __future__ import annotations

import math

import pytest

from plinth.core.clock import VirtualClock
from plinth.core.errors import PlinthError
from plinth.core.lifecycle import State
from plinth.core.resources import MILLI, Allocation, Cluster, Node, Request, WorkerSlot
from plinth.core.runtime import (
    EventKind,
    Handle,
    LaunchSpec,
    RuntimeEvent,
    WorkerLaunch,
    worker_launches,
)
from plinth.core.throughput import FIXED_SPEED
from plinth.core.workload import Job
from plinth.runtime.sim import SimRuntime
from plinth.runtime.sim_behaviour import (
    KILLED_EXIT_CODE,
    STOPPED_EXIT_CODE,
    SimBehaviour,
    gang_end,
)
from plinth.sched.policies import make_policy
from plinth.sched.types import SchedConfig
from plinth.sim.engine import simulate
from plinth.sim.traces.synthetic import synthetic_jobs

CFG = SchedConfig(checkpoint_interval=60.0, restore_overhead=30.0)
ONE_NODE = Cluster((Node("n0", 64_000, 256_000, "V100", 4),))


def job(jid: int, duration: float = 300.0, *, workers: int = 1, retries: int = 0) -> Job:
    return Job(jid, 0.0, duration, Request(gpus=1, workers=workers), job_type=FIXED_SPEED,
               retries=retries)


class Sim:
    """A simulated runtime on ONE_NODE and the virtual clock it reads."""

    def __init__(self, jobs: list[Job], scripts: dict | None = None, *, cluster=ONE_NODE,
                 **kw) -> None:
        behaviour = None if scripts is None else (lambda j, a: scripts.get((j.id, a)))
        self.clock = VirtualClock()
        self.jobs = {j.id: j for j in jobs}
        self.cluster = cluster
        self.rt = SimRuntime(cluster, CFG.work_model(cluster), self.jobs, clock=self.clock,
                             behaviour=behaviour, **kw)

    def at(self, t: float) -> Sim:
        self.clock.to(t)
        return self

    def launch(self, jid: int, attempt: int = 1, alloc: Allocation | None = None) -> Handle:
        workers = self.jobs[jid].request.workers
        alloc = alloc or Allocation(tuple(WorkerSlot(0, (r,)) for r in range(workers)))
        return self.rt.launch(LaunchSpec(jid, attempt, (), worker_launches(
            self.cluster, alloc, self.jobs[jid].request), "", checkpoint_dir=f"/ck/{jid}"))

    def stop(self, jid: int, attempt: int = 1, *, grace_s: float = 10.0,
             checkpoint: bool = False) -> list[RuntimeEvent]:
        self.rt.stop(jid, attempt, grace_s, checkpoint=checkpoint)
        return self.rt.poll()

    def poll(self, t: float | None = None) -> list[RuntimeEvent]:
        if t is not None:
            self.clock.to(t)
        return self.rt.poll()


def started(jid: int, attempt: int, at: float, rate: float = 1.0, every: float = 60.0
            ) -> RuntimeEvent:
    return RuntimeEvent(jid, attempt, EventKind.STARTED, at=at, rate=rate, checkpoint_every=every)


def exited(jid: int, attempt: int, code: int, message: str = "", at: float | None = None
           ) -> RuntimeEvent:
    return RuntimeEvent(jid, attempt, EventKind.EXITED, code, message, at=at)


def lost(jid: int, attempt: int, message: str) -> RuntimeEvent:
    return RuntimeEvent(jid, attempt, EventKind.LOST, message=message)


def saved(jid: int, attempt: int, at: float, step: int | None = None) -> RuntimeEvent:
    what = "checkpoint as it stopped" if step is None else f"checkpoint at step {step}"
    return RuntimeEvent(jid, attempt, EventKind.CHECKPOINTED, message=what, step=step, at=at)


# ---------------------------------------------------------------------------------- the default

def test_the_default_model_is_unchanged():
    sim = Sim([job(1), job(2)])
    assert sim.launch(1) == Handle(1, 1, (), "/ck/1")
    sim.launch(2)
    assert sim.poll() == [started(1, 1, 0.0), started(2, 1, 0.0)]
    assert sim.rt.next_time() == 300.0
    # A stop is honoured at once (143), with or without a save, whatever the grace.
    assert sim.at(100.0).stop(1, checkpoint=True) == [saved(1, 1, 100.0),
                                                      exited(1, 1, STOPPED_EXIT_CODE)]
    assert sim.rt.saved[1] == 100.0
    sim.launch(1, 2)
    assert sim.poll() == [started(1, 2, 130.0)]
    assert sim.rt.next_time() == 300.0
    assert sim.poll(300.0) == [exited(2, 1, 0)]
    assert sim.rt.next_time() == 330.0 and sim.poll(330.0) == [exited(1, 2, 0)]
    assert sim.rt.next_time() is None and sim.rt.nodes() == list(ONE_NODE.nodes)


def test_a_default_behaviour_acts_exactly_as_none():
    """The behaving path, given `SimBehaviour()`, gives the same numbers as the default one."""
    cluster = Cluster(tuple(Node(f"n{i}", 64_000, 256_000, m, 4)
                            for i, m in enumerate(["V100", "V100", "K80", "K80"])))
    for name in ("tiresias", "gavel"):
        jobs = synthetic_jobs(60, seed=3, load=1.5, cluster_gpus=16)
        plain = simulate(jobs, cluster, make_policy(name), CFG, validate=True)
        acted = simulate(jobs, cluster, make_policy(name), CFG, validate=True,
                         behaviour=lambda j, a: SimBehaviour())
        assert plain.preemptions > 0
        assert [(js.id, js.first_start, js.end_time, js.preemptions, js.progress, js.attempt)
                for js in plain.jobs] == \
               [(js.id, js.first_start, js.end_time, js.preemptions, js.progress, js.attempt)
                for js in acted.jobs]
        assert (plain.lost_work_s, plain.passes) == (acted.lost_work_s, acted.passes)


def test_no_grace_is_a_kill_that_saves_nothing():
    sim = Sim([job(1)])
    sim.launch(1)
    sim.poll()
    assert sim.at(150.0).stop(1, grace_s=0, checkpoint=True) == [
        exited(1, 1, KILLED_EXIT_CODE)]
    assert sim.rt.saved[1] == 120.0  # only its last periodic checkpoint


def test_a_stale_stop_leaves_the_running_attempt_alone():
    sim = Sim([job(1)])
    sim.launch(1, 2)
    sim.poll()
    assert sim.at(10.0).stop(1, 1) == []
    assert sim.rt.next_time() == 300.0 and sim.poll(300.0) == [exited(1, 2, 0)]


# ---------------------------------------------------------------------------------- behaviours

def test_a_stop_it_ignores_ends_when_the_grace_runs_out():
    sim = Sim([job(1)], {(1, 1): SimBehaviour(ignore_term=True)})
    sim.launch(1)
    sim.poll()
    # nothing saved: it ignored it
    assert sim.at(10.0).stop(1, grace_s=5.0, checkpoint=True) == []
    assert sim.rt.next_time() == 15.0
    assert sim.poll(14.999) == []
    assert sim.poll(15.0) == [exited(1, 1, KILLED_EXIT_CODE,
                                     "stopped (SIGTERM, SIGKILL after 5s)")]
    assert sim.rt.next_time() is None
    assert sim.rt.saved[1] == 0.0  # 15 s of work is short of the first periodic checkpoint


def test_work_done_within_the_grace_exits_on_its_own():
    sim = Sim([job(1, 12.0)], {(1, 1): SimBehaviour(ignore_term=True, exit_code=2)})
    sim.launch(1)
    sim.poll()
    assert sim.at(10.0).stop(1, grace_s=5.0) == []
    assert sim.rt.next_time() == 12.0
    assert sim.poll(20.0) == [exited(1, 1, 2, "stopped (SIGTERM, SIGKILL after 5s)")]


def test_saves_and_ends_come_in_time_order_ties_in_launch_order():
    jobs = [job(1, 5.0), job(2, 2.0), job(3, 2.0)]
    scripts = {(1, 1): SimBehaviour(checkpoints=((1.0, 10), (3.0, 30))),
               (3, 1): SimBehaviour(checkpoints=((2.0, 7),))}
    sim = Sim(jobs, scripts)
    for j in jobs:
        sim.launch(j.id)
    started_ = sim.poll()
    assert [e.checkpoint_every for e in started_] == [0.0, 60.0, 0.0]  # listed saves: events
    assert sim.rt.next_time() == 1.0
    assert sim.poll(10.0) == [
        saved(1, 1, 1.0, 10),
        exited(2, 1, 0),  # at 2.0, launched before job 3
        saved(3, 1, 2.0, 7), exited(3, 1, 0),  # a save at its end comes first
        saved(1, 1, 3.0, 30), exited(1, 1, 0)]


def test_next_time_includes_saves_and_future_ends():
    sim = Sim([job(1, 20.0)], {(1, 1): SimBehaviour(checkpoints=((5.0, 1),), vanish_at=8.0)})
    sim.at(100.0).launch(1)
    assert sim.rt.next_time() == 100.0  # its start is due at once
    sim.poll()
    assert sim.rt.next_time() == 105.0
    assert sim.poll(105.0) == [saved(1, 1, 105.0, 1)]
    assert sim.rt.next_time() == 108.0
    assert sim.poll(200.0) == [lost(1, 1, "rank 0 vanished")]
    assert sim.rt.next_time() is None


def test_a_job_resumes_from_its_last_listed_save():
    sim = Sim([job(1, 100.0)], {(1, 1): SimBehaviour(checkpoints=((10.0, 1), (40.0, 2)))})
    sim.launch(1)
    sim.poll()
    assert sim.poll(45.0) == [saved(1, 1, 10.0, 1), saved(1, 1, 40.0, 2)]
    assert sim.at(50.0).stop(1) == [exited(1, 1, STOPPED_EXIT_CODE,
                                           "stopped (SIGTERM, SIGKILL after 10s)")]
    assert sim.rt.saved[1] == 40.0  # the 10 s since the last save are lost
    sim.launch(1, 2)
    assert sim.poll() == [started(1, 2, 80.0)]
    assert sim.rt.next_time() == 80.0 + 60.0


def test_a_gang_fails_as_its_first_failing_worker_and_the_rest_are_stopped():
    b = SimBehaviour(ranks={1: SimBehaviour(exit_at=5.0, exit_code=3),
                            2: SimBehaviour(ignore_term=True)})
    sim = Sim([job(1, workers=3)], {(1, 1): b}, gang_grace_s=2.0)
    sim.launch(1)
    sim.poll()
    # Rank 1 fails at 5; rank 0 honours the gang's SIGTERM; rank 2 is killed at 7.
    assert sim.rt.next_time() == 7.0
    assert sim.poll(7.0) == [exited(1, 1, 3, "rank 1 exited with 3; the other workers "
                                             "were stopped")]


def test_lost_vanished_and_retried_attempts_go_back_through_the_owner():
    """The owner requeues a lost attempt and retries a failed one; the next resumes from the
    periodic checkpoint, after the restore, as the owner counts it."""
    scripts = {(1, 1): SimBehaviour(vanish_at=100.0), (2, 1): SimBehaviour(exit_at=50.0,
                                                                           exit_code=1)}
    r = simulate([job(1), job(2, retries=1)], ONE_NODE, make_policy("fifo"), CFG,
                 validate=True, behaviour=lambda j, a: scripts.get((j.id, a)))
    lost_, retried = r.jobs
    assert (lost_.status, lost_.attempt, lost_.end_time) == (State.SUCCEEDED, 2, 100 + 30 + 240)
    assert (retried.status, retried.attempt, retried.end_time) == (State.SUCCEEDED, 2,
                                                                   50 + 30 + 300)
    assert r.lost_work_s == 40.0 + 50.0
    assert len(r.ftf_rho) == 2  # each counted once, when it succeeded


# ---------------------------------------------------------------------------------- gang_end

def test_gang_end_first_nonzero_code_in_the_order_workers_ended():
    g = gang_end([(1.0, 0), (2.0, 4), (3.0, 5)], [False] * 3, [], gang_grace_s=10)
    assert (g.at, g.exit_code, g.worker_end) == (2.0, 4, (1.0, 2.0, 2.0))
    assert g.message == "rank 1 exited with 4; the other workers were stopped"


def test_gang_end_a_vanished_worker_loses_the_attempt():
    g = gang_end([(math.inf, 0), (1.0, None)], [True, False], [], gang_grace_s=3)
    assert (g.at, g.exit_code, g.message) == (4.0, None, "rank 1 vanished")


def test_gang_end_stops():
    # Honoured at once; ignored until the kill; no grace is the kill at once.
    ends, ign = [(math.inf, 0), (math.inf, 0)], [False, True]
    g = gang_end(ends, ign, [(1.0, 0.5)], gang_grace_s=10)
    assert (g.at, g.exit_code, g.worker_end, g.honoured) == (1.5, STOPPED_EXIT_CODE,
                                                            (1.0, 1.5), (True,))
    g = gang_end(ends, ign, [(1.0, 0.0)], gang_grace_s=10)
    assert (g.at, g.exit_code, g.honoured) == (1.0, KILLED_EXIT_CODE, (False,))
    g = gang_end(ends, [True, True], [(1.0, 5.0), (2.0, 1.0)], gang_grace_s=10)
    assert (g.at, g.exit_code, g.honoured) == (3.0, KILLED_EXIT_CODE, (False, False))
    assert gang_end(ends, ign, [], gang_grace_s=10).at == math.inf  # only a stop ends it


def test_gang_end_an_end_at_the_stop_comes_before_it():
    g = gang_end([(1.0, 0)], [False], [(1.0, 5.0)], gang_grace_s=10)
    assert (g.at, g.exit_code, g.honoured) == (1.0, 0, (False,))


# ---------------------------------------------------------------------------------- restarts

def test_a_restart_adopts_what_runs_and_reports_what_ended_while_down():
    jobs = [job(1, 100.0), job(2), job(3), job(4)]
    scripts = {(2, 1): SimBehaviour(checkpoints=((5.0, 1), (6.0, 2)), exit_at=10.0,
                                    exit_code=3),
               (3, 1): SimBehaviour(vanish_at=20.0),
               (4, 1): SimBehaviour(checkpoints=((5.0, 1), (60.0, 2)))}
    sim = Sim(jobs, scripts)
    handles = {j.id: sim.launch(j.id) for j in jobs}
    sim.poll()
    assert sim.poll(5.0) == [saved(2, 1, 5.0, 1), saved(4, 1, 5.0, 1)]
    old = sim.rt
    rt = old.restart()
    with pytest.raises(RuntimeError, match="restarted"):
        old.launch(LaunchSpec(9, 1, (), (), ""))
    sim.clock.to(50.0)
    assert rt.next_time() is None  # it watches nothing it has not adopted
    assert rt.adopt(handles[1]) is True and rt.poll() == []
    # Ended while down: its latest save (not the one before), then its end, and when.
    assert rt.adopt(handles[2]) is False
    assert rt.poll() == [saved(2, 1, 6.0, 2), exited(2, 1, 3, at=10.0)]
    assert rt.adopt(handles[3]) is False and rt.poll() == [lost(3, 1, "rank 0 vanished")]
    # Still running: its latest save again (at least once), then the rest as it comes.
    assert rt.find(4, 1, 1) == handles[4] and rt.find(4, 2, 1) is None
    assert rt.adopt(handles[4]) is True and rt.poll() == [saved(4, 1, 5.0, 1)]
    assert rt.adopt(handles[1]) is True  # adopted already
    assert rt.adopt(handles[2]) is False and rt.find(2, 1, 1) is None
    assert rt.adopt(Handle(9, 1, ())) is False
    assert rt.poll()[-1] == lost(9, 1, "not running here and no exit code left")
    sim.clock.to(400.0)
    assert rt.poll() == [saved(4, 1, 60.0, 2), exited(1, 1, 0), exited(4, 1, 0)]
    assert rt.saved[2] == 6.0  # what attempt 2 resumes from


def test_a_stop_after_a_restart_reaches_the_adopted_attempt():
    sim = Sim([job(1)], {(1, 1): SimBehaviour(ignore_term=True)})
    h = sim.launch(1)
    sim.poll()
    rt = sim.rt.restart()
    sim.clock.to(5.0)
    rt.stop(1, 1, 3.0)
    assert rt.poll() == []  # not adopted yet: nothing to stop here
    assert rt.adopt(h) is True
    sim.clock.to(6.0)
    rt.stop(1, 1, 3.0)
    assert rt.poll() == [] and rt.next_time() == 9.0
    sim.clock.to(9.0)
    assert rt.poll() == [exited(1, 1, KILLED_EXIT_CODE, "stopped (SIGTERM, SIGKILL after 3s)")]


# ---------------------------------------------------------------------------------- the gang env

def test_worker_env_of_a_gang_across_nodes():
    cluster = Cluster((Node("a", 64_000, 256_000, "A100", 4),
                       Node("b", 64_000, 256_000, "A100", 4)))
    req = Request(gpus=2, workers=3, cpus_milli=2000, memory_mib=1024)
    alloc = Allocation((WorkerSlot(0, (2, 3)), WorkerSlot(1, (4, 5)), WorkerSlot(1, (6, 7))))
    assert [(w.rank, w.node, w.gpus, w.gpu_milli, w.cpus_milli, w.memory_mib)
            for w in worker_launches(cluster, alloc, req)] == [
        (0, "a", (2, 3), MILLI, 2000, 1024), (1, "b", (0, 1), MILLI, 2000, 1024),
        (2, "b", (2, 3), MILLI, 2000, 1024)]
    sim = Sim([Job(5, 0.0, 10.0, req)], cluster=cluster)
    sim.launch(5, alloc=alloc)
    env = sim.rt.worker_env(5, 1)
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["CUDA_VISIBLE_DEVICES"])
            for e in env.values()] == [("0", "0", "1", "2,3"), ("1", "0", "2", "0,1"),
                                       ("2", "1", "2", "2,3")]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"], e["PLINTH_ATTEMPT"],
             e["PLINTH_CHECKPOINT_DIR"]) for e in env.values()} == {("a", "29501", "3", "1",
                                                                    "/ck/5")}
    with pytest.raises(LookupError, match="job 5 attempt 2 is not running"):
        sim.rt.worker_env(5, 2)


def test_a_worker_on_a_node_the_cluster_lacks_fails_its_launch():
    sim = Sim([job(1)])
    bad = LaunchSpec(1, 1, (), (WorkerLaunch(0, "elsewhere", (0,)),), "")
    with pytest.raises(PlinthError, match="node 'elsewhere', which the simulated cluster"):
        sim.rt.launch(bad)
    assert sim.rt.poll() == [] and sim.rt.next_time() is None


def test_a_fractional_share_names_its_share():
    req = Request(gpu_milli=250, gpu_memory_mib=4096)
    alloc = Allocation((WorkerSlot(0, (1,), 250, 4096),))
    (w,) = worker_launches(ONE_NODE, alloc, req)
    assert (w.gpus, w.gpu_milli, w.gpu_memory_mib) == ((1,), 250, 4096)


# ---------------------------------------------------------------------------------- checks

@pytest.mark.parametrize("kw, field", [
    ({"exit_at": -1.0}, "exit_at"), ({"vanish_at": math.nan}, "vanish_at"),
    ({"checkpoints": ((2.0, 1), (1.0, 2))}, "checkpoints"),
    ({"checkpoints": ((1.0, -1),)}, "checkpoints"),
    ({"ranks": {1: SimBehaviour(ranks={0: SimBehaviour()})}}, r"ranks\[1\]")])
def test_a_behaviour_names_what_is_wrong(kw, field):
    with pytest.raises(ValueError, match=field):
        SimBehaviour(**kw)


def test_a_negative_grace_is_refused():
    with pytest.raises(ValueError, match="gang_grace_s must be >= 0 seconds, got -1"):
        Sim([job(1)], gang_grace_s=-1)
    sim = Sim([job(1)])
    sim.launch(1)
    with pytest.raises(ValueError, match="grace_s must be >= 0 seconds"):
        sim.rt.stop(1, 1, -1)
