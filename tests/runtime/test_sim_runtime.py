"""The simulated runtime's behaviours: what a simulated job can act out besides its work, in
virtual time (the contract suite, test_contract.py, runs it against the shared checks too)."""

from __future__ import annotations

import functools
import math

import pytest

from plinth.core.resources import MILLI, Allocation, Cluster, Node, Request, WorkerSlot
from plinth.core.throughput import FIXED_SPEED
from plinth.core.workload import Job
from plinth.runtime.base import worker_launches
from plinth.runtime.sim import (
    KILLED_EXIT_CODE,
    STOPPED_EXIT_CODE,
    SimBehaviour,
    SimRuntime,
    gang_end,
)
from plinth.core.lifecycle import State, StopReason
from plinth.sched.owner import CheckpointSaved, Exited, Launch, Lost, Started, Stop
from plinth.sched.policies import make_policy
from plinth.sched.types import SchedConfig
from plinth.sim import engine
from plinth.sim.engine import simulate
from plinth.sim.traces.synthetic import synthetic_jobs

CFG = SchedConfig(checkpoint_interval=60.0, restore_overhead=30.0)
ONE_NODE = Cluster((Node("n0", 64_000, 256_000, "V100", 4),))


def job(jid: int, duration: float = 300.0, *, workers: int = 1, retries: int = 0) -> Job:
    return Job(jid, 0.0, duration, Request(gpus=1, workers=workers), job_type=FIXED_SPEED,
               retries=retries)


def launch(jid: int, attempt: int = 1, *, workers: int = 1) -> Launch:
    alloc = Allocation(tuple(WorkerSlot(0, (r,)) for r in range(workers)))
    return Launch(jid, attempt, alloc, "test", "V100")


def stop(jid: int, attempt: int = 1, *, checkpoint: bool = False) -> Stop:
    return Stop(jid, attempt, StopReason.PREEMPT, "test", checkpoint)


def runtime(jobs: list[Job], scripts: dict | None = None, **kw) -> SimRuntime:
    behaviour = None if scripts is None else (lambda j, a: scripts.get((j.id, a)))
    return SimRuntime(ONE_NODE, CFG, {j.id: j for j in jobs}, behaviour=behaviour, **kw)


# ---------------------------------------------------------------------------------- the default

def test_the_default_model_is_unchanged():
    rt = runtime([job(1), job(2)])
    assert rt.execute([launch(1), launch(2)], 0.0) == [Started(1, 1, 0.0, 1.0, 60.0),
                                                        Started(2, 1, 0.0, 1.0, 60.0)]
    assert rt.next_time() == 300.0
    # A stop is honoured at once (143), with or without a save, whatever the grace.
    assert rt.execute([stop(1, checkpoint=True)], 100.0) == [CheckpointSaved(1, 1, 100.0),
                                                             Exited(1, 1, STOPPED_EXIT_CODE)]
    assert rt.saved[1] == 100.0
    assert rt.execute([launch(1, 2)], 100.0) == [Started(1, 2, 130.0, 1.0, 60.0)]
    assert rt.next_time() == 300.0
    assert rt.advance(300.0) == [Exited(2, 1, 0)]
    assert rt.next_time() == 330.0 and rt.advance(330.0) == [Exited(1, 2, 0)]
    assert rt.next_time() is None


def test_a_default_behaviour_acts_exactly_as_none(monkeypatch):
    """The behaving path, given `SimBehaviour()`, gives the same numbers as the default one."""
    cluster = Cluster(tuple(Node(f"n{i}", 64_000, 256_000, m, 4)
                            for i, m in enumerate(["V100", "V100", "K80", "K80"])))
    for name in ("tiresias", "gavel"):
        jobs = synthetic_jobs(60, seed=3, load=1.5, cluster_gpus=16)
        plain = simulate(jobs, cluster, make_policy(name), CFG, validate=True)
        monkeypatch.setattr(engine, "SimRuntime", functools.partial(
            SimRuntime, behaviour=lambda j, a: SimBehaviour()))
        acted = simulate(jobs, cluster, make_policy(name), CFG, validate=True)
        monkeypatch.undo()
        assert plain.preemptions > 0
        assert [(js.id, js.first_start, js.end_time, js.preemptions, js.progress, js.attempt)
                for js in plain.jobs] == \
               [(js.id, js.first_start, js.end_time, js.preemptions, js.progress, js.attempt)
                for js in acted.jobs]
        assert (plain.lost_work_s, plain.passes) == (acted.lost_work_s, acted.passes)


def test_no_grace_is_a_kill_that_saves_nothing():
    rt = runtime([job(1)], grace_s=0)
    rt.execute([launch(1)], 0.0)
    assert rt.execute([stop(1, checkpoint=True)], 150.0) == [Exited(1, 1, KILLED_EXIT_CODE)]
    assert rt.saved[1] == 120.0  # only its last periodic checkpoint


def test_a_stale_stop_leaves_the_running_attempt_alone():
    rt = runtime([job(1)])
    rt.execute([launch(1, 2)], 0.0)
    assert rt.execute([stop(1, 1)], 10.0) == []
    assert rt.next_time() == 300.0 and rt.advance(300.0) == [Exited(1, 2, 0)]


# ---------------------------------------------------------------------------------- behaviours

def test_a_stop_it_ignores_ends_when_the_grace_runs_out():
    rt = runtime([job(1)], {(1, 1): SimBehaviour(ignore_term=True)}, grace_s=5.0)
    rt.execute([launch(1)], 0.0)
    assert rt.execute([stop(1, checkpoint=True)], 10.0) == []  # nothing saved: it ignored it
    assert rt.next_time() == 15.0
    assert rt.advance(14.999) == []
    assert rt.advance(15.0) == [Exited(1, 1, KILLED_EXIT_CODE,
                                       "stopped (SIGTERM, SIGKILL after 5s)")]
    assert rt.next_time() is None
    assert rt.saved[1] == 0.0  # 15 s of work is short of the first periodic checkpoint


def test_work_done_within_the_grace_exits_on_its_own():
    rt = runtime([job(1, 12.0)], {(1, 1): SimBehaviour(ignore_term=True, exit_code=2)},
                 grace_s=5.0)
    rt.execute([launch(1)], 0.0)
    assert rt.execute([stop(1)], 10.0) == []
    assert rt.next_time() == 12.0
    assert rt.advance(20.0) == [Exited(1, 1, 2, "stopped (SIGTERM, SIGKILL after 5s)")]


def test_saves_and_ends_come_in_time_order_ties_in_launch_order():
    jobs = [job(1, 5.0), job(2, 2.0), job(3, 2.0)]
    scripts = {(1, 1): SimBehaviour(checkpoints=((1.0, 10), (3.0, 30))),
               (3, 1): SimBehaviour(checkpoints=((2.0, 7),))}
    rt = runtime(jobs, scripts)
    started = rt.execute([launch(1), launch(2), launch(3)], 0.0)
    assert [e.checkpoint_every for e in started] == [0.0, 60.0, 0.0]  # listed saves: events
    assert rt.next_time() == 1.0
    assert rt.advance(10.0) == [
        CheckpointSaved(1, 1, 1.0, 10),
        Exited(2, 1, 0),  # at 2.0, launched before job 3
        CheckpointSaved(3, 1, 2.0, 7), Exited(3, 1, 0),  # a save at its end comes first
        CheckpointSaved(1, 1, 3.0, 30), Exited(1, 1, 0)]


def test_next_time_includes_saves_and_future_ends():
    rt = runtime([job(1, 20.0)], {(1, 1): SimBehaviour(checkpoints=((5.0, 1),),
                                                       vanish_at=8.0)})
    rt.execute([launch(1)], 100.0)
    assert rt.next_time() == 105.0
    assert rt.advance(105.0) == [CheckpointSaved(1, 1, 105.0, 1)]
    assert rt.next_time() == 108.0
    assert rt.advance(200.0) == [Lost(1, 1, "rank 0 vanished")]
    assert rt.next_time() is None


def test_a_job_resumes_from_its_last_listed_save():
    rt = runtime([job(1, 100.0)], {(1, 1): SimBehaviour(checkpoints=((10.0, 1), (40.0, 2)))})
    rt.execute([launch(1)], 0.0)
    assert rt.advance(45.0) == [CheckpointSaved(1, 1, 10.0, 1), CheckpointSaved(1, 1, 40.0, 2)]
    assert rt.execute([stop(1)], 50.0) == [Exited(1, 1, STOPPED_EXIT_CODE,
                                                  "stopped (SIGTERM, SIGKILL after 10s)")]
    assert rt.saved[1] == 40.0  # the 10 s since the last save are lost
    assert rt.execute([launch(1, 2)], 50.0) == [Started(1, 2, 80.0, 1.0, 60.0)]
    assert rt.next_time() == 80.0 + 60.0


def test_a_gang_fails_as_its_first_failing_worker_and_the_rest_are_stopped():
    b = SimBehaviour(ranks={1: SimBehaviour(exit_at=5.0, exit_code=3),
                            2: SimBehaviour(ignore_term=True)})
    rt = runtime([job(1, workers=3)], {(1, 1): b}, gang_grace_s=2.0)
    rt.execute([launch(1, workers=3)], 0.0)
    # Rank 1 fails at 5; rank 0 honours the gang's SIGTERM; rank 2 is killed at 7.
    assert rt.next_time() == 7.0
    assert rt.advance(7.0) == [Exited(1, 1, 3, "rank 1 exited with 3; the other workers "
                                               "were stopped")]


def test_lost_vanished_and_retried_attempts_go_back_through_the_owner(monkeypatch):
    """The owner requeues a lost attempt and retries a failed one; the next resumes from the
    periodic checkpoint, after the restore, as the owner counts it."""
    scripts = {(1, 1): SimBehaviour(vanish_at=100.0), (2, 1): SimBehaviour(exit_at=50.0,
                                                                           exit_code=1)}
    monkeypatch.setattr(engine, "SimRuntime", functools.partial(
        SimRuntime, behaviour=lambda j, a: scripts.get((j.id, a))))
    r = simulate([job(1), job(2, retries=1)], ONE_NODE, make_policy("fifo"), CFG,
                 validate=True)
    lost, retried = r.jobs
    assert (lost.status, lost.attempt, lost.end_time) == (State.SUCCEEDED, 2, 100 + 30 + 240)
    assert (retried.status, retried.attempt, retried.end_time) == (State.SUCCEEDED, 2,
                                                                   50 + 30 + 300)
    assert r.lost_work_s == 40.0 + 50.0


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
    old = runtime(jobs, scripts)
    old.execute([launch(j.id) for j in jobs], 0.0)
    assert old.advance(5.0) == [CheckpointSaved(2, 1, 5.0, 1), CheckpointSaved(4, 1, 5.0, 1)]
    rt = old.restart()
    with pytest.raises(RuntimeError, match="restarted"):
        old.advance(6.0)
    assert rt.next_time() is None  # it watches nothing it has not adopted
    assert rt.adopt(1, 1, 50.0) == (True, [])
    # Ended while down: its latest save (not the one before), then its end.
    assert rt.adopt(2, 1, 50.0) == (False, [CheckpointSaved(2, 1, 6.0, 2), Exited(2, 1, 3)])
    assert rt.adopt(3, 1, 50.0) == (False, [Lost(3, 1, "rank 0 vanished")])
    # Still running: its latest save again (at least once), then the rest as it comes.
    assert rt.adopt(4, 1, 50.0) == (True, [CheckpointSaved(4, 1, 5.0, 1)])
    assert rt.adopt(1, 1, 50.0) == (True, [])  # adopted already
    assert rt.adopt(2, 1, 50.0)[0] is False and rt.adopt(9, 1, 50.0)[0] is False
    assert rt.advance(400.0) == [CheckpointSaved(4, 1, 60.0, 2), Exited(1, 1, 0),
                                 Exited(4, 1, 0)]
    assert rt.saved[2] == 6.0  # what attempt 2 resumes from


def test_a_stop_after_a_restart_reaches_the_adopted_attempt():
    old = runtime([job(1)], {(1, 1): SimBehaviour(ignore_term=True)}, grace_s=3.0)
    old.execute([launch(1)], 0.0)
    rt = old.restart()
    assert rt.execute([stop(1)], 5.0) == []  # not adopted yet: nothing to stop here
    assert rt.adopt(1, 1, 5.0) == (True, [])
    assert rt.execute([stop(1)], 6.0) == [] and rt.next_time() == 9.0
    assert rt.advance(9.0) == [Exited(1, 1, KILLED_EXIT_CODE,
                                      "stopped (SIGTERM, SIGKILL after 3s)")]


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
    rt = SimRuntime(cluster, CFG, {5: Job(5, 0.0, 10.0, req)}, checkpoint_root="/ck")
    rt.execute([Launch(5, 1, alloc, "test", "A100")], 0.0)
    env = rt.worker_env(5, 1)
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["CUDA_VISIBLE_DEVICES"])
            for e in env.values()] == [("0", "0", "1", "2,3"), ("1", "0", "2", "0,1"),
                                       ("2", "1", "2", "2,3")]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"], e["PLINTH_ATTEMPT"],
             e["PLINTH_CHECKPOINT_DIR"]) for e in env.values()} == {("a", "29501", "3", "1",
                                                                    "/ck/5")}
    with pytest.raises(LookupError, match="job 5 attempt 2 is not running"):
        rt.worker_env(5, 2)


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
    with pytest.raises(ValueError, match="grace_s must be >= 0 seconds, got -1"):
        runtime([job(1)], grace_s=-1)
    rt = runtime([job(1)])
    with pytest.raises(ValueError, match="grace_s"):
        rt.execute([stop(1)], 0.0, grace_s=-1)
