"""The runtime contract: what every runtime (local, simulated, Ray) does, tested the same way.

Each test drives a `harness` (contract_harness.py), parametrized over the runtimes in HARNESSES,
with short scenarios. After every test the harness also checks the invariants that hold always:
events only for launched attempts, one terminal event per attempt and nothing after it,
checkpoint steps that never go back. Stops are also timed (`took`): on a virtual clock exactly,
on a real one never early and within the harness's polling slack.
"""

from __future__ import annotations

import pytest
from contract_harness import FOREVER_S, HARNESSES, Harness, Scenario

from plinth.runtime import EventKind

STOPPED = 143  # 128 + SIGTERM: the job honoured the stop
KILLED = 137  # 128 + SIGKILL: the grace ran out


@pytest.fixture(params=sorted(HARNESSES))
def harness(request, tmp_path):
    h: Harness = HARNESSES[request.param](tmp_path)
    try:
        yield h
        h.check_invariants()
    finally:
        h.close()


def kinds(events) -> list[tuple[EventKind, int | None]]:
    """(kind, step or exit code) of each event."""
    return [(e.kind, e.step if e.kind is EventKind.CHECKPOINTED else e.exit_code) for e in events]


def took(harness: Harness, event, since: float, seconds: float) -> None:
    """`event` came `seconds` after `since` on the runtime's clock, within the harness's slack."""
    t = harness.seen_at(event) - since
    assert seconds - harness.early_s <= t <= seconds + harness.late_s, \
        f"{harness.name}: {event} came {t:.6f}s after, not {seconds}s"


# ---------------------------------------------------------------------------------- launching

def test_gang_environment(harness):
    h = harness.launch(Scenario(duration_s=0.2), workers=2, gpus_per_worker=2)
    env = [harness.worker_env(h, r) for r in range(2)]
    for r, e in enumerate(env):
        assert (e["RANK"], e["WORLD_SIZE"]) == (str(r), "2")
        assert (e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == (str(r), "2")  # one node
        assert (e["PLINTH_JOB_ID"], e["PLINTH_ATTEMPT"]) == (str(h.job_id), "1")
        assert e["PLINTH_CHECKPOINT_DIR"] == harness.checkpoint_dir(h)
        assert e["MASTER_ADDR"] and e["MASTER_ADDR"] == env[0]["MASTER_ADDR"]
        assert 0 < int(e["MASTER_PORT"]) < 65536 and e["MASTER_PORT"] == env[0]["MASTER_PORT"]
    devices = [e["CUDA_VISIBLE_DEVICES"].split(",") for e in env]
    assert [len(d) for d in devices] == [2, 2]
    assert len(set(devices[0] + devices[1])) == 4  # no GPU given to two workers
    assert harness.terminal(h).exit_code == 0


def test_a_worker_without_gpus_sees_none(harness):
    h = harness.launch(Scenario(duration_s=0.1))
    assert harness.worker_env(h, 0)["CUDA_VISIBLE_DEVICES"] == ""
    ev = harness.terminal(h)
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, 0)


def test_attempts_of_one_job_are_told_apart(harness):
    first = harness.launch(Scenario(duration_s=0.1))
    harness.terminal(first)
    second = harness.launch(Scenario(duration_s=0.1), job_id=first.job_id, attempt=2)
    assert harness.worker_env(second, 0)["PLINTH_ATTEMPT"] == "2"
    assert harness.terminal(second).attempt == 2


# ---------------------------------------------------------------------------------- exits

@pytest.mark.parametrize("code", [0, 3])
def test_exit_code(harness, code):
    h = harness.launch(Scenario(duration_s=0.1, exit_code=code))
    ev = harness.terminal(h)
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, code)


def test_first_nonzero_code_of_the_gang_and_the_rest_are_stopped(harness):
    # Ranks 0 and 2 would run for an hour: the end comes only because the gang is stopped.
    h = harness.launch(Scenario(duration_s=FOREVER_S,
                                ranks={1: Scenario(duration_s=0.1, exit_code=3)}), workers=3)
    ev = harness.terminal(h)
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, 3)


def test_gang_exits_zero_only_when_every_worker_does(harness):
    h = harness.launch(Scenario(duration_s=0.1, ranks={1: Scenario(duration_s=0.3)}), workers=2)
    assert harness.terminal(h).exit_code == 0


def test_a_vanished_worker_is_lost(harness):
    h = harness.launch(Scenario(duration_s=0.1, vanish=True))
    ev = harness.terminal(h)
    assert (ev.kind, ev.exit_code) == (EventKind.LOST, None)


def test_a_vanished_gang_member_loses_the_attempt(harness):
    h = harness.launch(Scenario(duration_s=FOREVER_S,
                                ranks={1: Scenario(duration_s=0.1, vanish=True)}), workers=2)
    assert harness.terminal(h).kind is EventKind.LOST


# ---------------------------------------------------------------------------------- stopping

def test_stop_honoured(harness):
    h = harness.launch(Scenario(duration_s=FOREVER_S), workers=2)
    t_stop = harness.now()
    harness.stop(h, grace_s=30)
    ev = harness.terminal(h)  # long before the grace runs out, or this times out
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, STOPPED)
    took(harness, ev, t_stop, 0)


def test_stop_ignored_is_killed_after_the_grace(harness):
    h = harness.launch(Scenario(duration_s=FOREVER_S, ignore_term=True))
    t_stop = harness.now()
    harness.stop(h, grace_s=0.5)
    ev = harness.terminal(h)
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, KILLED)
    took(harness, ev, t_stop, 0.5)  # not before the grace runs out


def test_stop_of_a_gang_with_one_stubborn_worker(harness):
    # Rank 0 stops at once (143), rank 1 only when killed (137): the first non-zero code wins.
    h = harness.launch(Scenario(duration_s=FOREVER_S,
                                ranks={1: Scenario(duration_s=FOREVER_S, ignore_term=True)}),
                       workers=2)
    t_stop = harness.now()
    harness.stop(h, grace_s=0.5)
    ev = harness.terminal(h)
    assert ev.exit_code == STOPPED
    took(harness, ev, t_stop, 0.5)  # the attempt ends with its last worker, when killed


def test_stop_with_no_grace_kills_at_once(harness):
    h = harness.launch(Scenario(duration_s=FOREVER_S))
    t_stop = harness.now()
    harness.stop(h, grace_s=0)
    ev = harness.terminal(h)
    assert ev.exit_code == KILLED
    took(harness, ev, t_stop, 0)


def test_stop_after_the_end_and_of_an_unknown_attempt_does_nothing(harness):
    h = harness.launch(Scenario(duration_s=0.1, exit_code=2))
    assert harness.terminal(h).exit_code == 2
    harness.stop(h, grace_s=0)
    harness.stop(type(h)(h.job_id, h.attempt + 5, ()), grace_s=0)
    harness.advance(0.3)
    assert kinds(harness.events_of(h)) == [(EventKind.EXITED, 2)]


# ---------------------------------------------------------------------------------- checkpoints

def test_checkpoints_are_reported_in_order_before_the_exit(harness):
    t0 = harness.now()
    h = harness.launch(Scenario(duration_s=0.8, checkpoints=((0.1, 3), (0.4, 7))), workers=2)
    end = harness.terminal(h)
    evs = harness.events_of(h)
    saves = [e for e in evs if e.kind is EventKind.CHECKPOINTED]
    # Saves closer together than the runtime looks may be reported as the later one only;
    # the last save before the exit is always reported, and before the exit.
    assert saves and saves[-1].step == 7 and {e.step for e in saves} <= {3, 7}
    assert evs == [*saves, end] and end.exit_code == 0
    assert all(e.attempt == 1 and t0 <= e.at <= harness.now() for e in saves)


def test_a_save_right_before_the_exit_comes_first(harness):
    h = harness.launch(Scenario(duration_s=0.2, checkpoints=((0.2, 5),), exit_code=1))
    harness.terminal(h)
    assert kinds(harness.events_of(h)) == [(EventKind.CHECKPOINTED, 5), (EventKind.EXITED, 1)]


def test_a_stopped_job_reports_its_saves_and_then_the_stop(harness):
    h = harness.launch(Scenario(duration_s=FOREVER_S, checkpoints=((0.1, 4),)))
    harness.run_until(lambda: harness.events_of(h), "the checkpoint")
    harness.stop(h, grace_s=30)
    harness.terminal(h)
    assert kinds(harness.events_of(h)) == [(EventKind.CHECKPOINTED, 4), (EventKind.EXITED, STOPPED)]


def test_an_earlier_attempts_checkpoint_is_not_reported_again(harness):
    first = harness.launch(Scenario(duration_s=0.2, checkpoints=((0.1, 4),)))
    harness.terminal(first)
    assert kinds(harness.events_of(first)) == [(EventKind.CHECKPOINTED, 4), (EventKind.EXITED, 0)]
    # Same checkpoint directory, where attempt 1's save is still the latest.
    second = harness.launch(Scenario(duration_s=0.4), job_id=first.job_id, attempt=2)
    harness.terminal(second)
    assert kinds(harness.events_of(second)) == [(EventKind.EXITED, 0)]


# ---------------------------------------------------------------------------------- restarts

def test_restart_adopts_running_workers_and_can_stop_them(harness):
    h = harness.launch(Scenario(duration_s=FOREVER_S), workers=2)
    harness.restart()
    harness.advance(0.2)
    assert harness.events_of(h) == []  # still running, under the new runtime
    harness.stop(h, grace_s=30)
    assert harness.terminal(h).exit_code == STOPPED


def test_restart_finds_a_launch_that_was_never_recorded(harness):
    h = harness.launch(Scenario(duration_s=FOREVER_S), workers=2)
    harness.restart(recorded=False)  # as after a control plane killed during the launch
    harness.advance(0.2)
    assert harness.events_of(h) == []
    harness.stop(h, grace_s=30)
    assert harness.terminal(h).exit_code == STOPPED


def test_restart_keeps_watching_exits_and_checkpoints(harness):
    h = harness.launch(Scenario(duration_s=0.8, checkpoints=((0.4, 6),), exit_code=5))
    harness.restart()
    end = harness.terminal(h)
    assert end.exit_code == 5
    # The save may be reported by either runtime, or by both (at least once): never after the end.
    evs = harness.events_of(h)
    assert {e.step for e in evs[:-1]} == {6} and evs[-1] == end


def test_an_attempt_that_ended_while_down_reports_its_end(harness):
    h = harness.launch(Scenario(duration_s=0.2, checkpoints=((0.1, 2),), exit_code=4))
    harness.restart(down_s=1.0)
    assert harness.terminal(h).exit_code == 4
    evs = harness.events_of(h)
    assert {e.step for e in evs[:-1]} == {2}


def test_an_attempt_that_vanished_while_down_is_lost(harness):
    h = harness.launch(Scenario(duration_s=0.2, vanish=True))
    harness.restart(down_s=1.0)
    assert harness.terminal(h).kind is EventKind.LOST
