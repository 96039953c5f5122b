"""Dependencies (after, afterany, afterok, afternotok) and job arrays (`array: 0-99%10`), held in
the control plane until they may run, as Slurm holds them. Most run on a control plane in
virtual time (virtual.py); the array's tasks' environment and `submit --wait`, on a real one."""

from __future__ import annotations

import pytest
from plinth_platform import run_cli
from virtual_http import served

from plinth.client import ApiError
from plinth.core.errors import SpecError
from plinth.core.jobspec import JobSpec, parse_array
from plinth.core.lifecycle import State
from plinth.core.spec import spec_from_dict
from plinth.core.workload import Job
from plinth.runtime.sim_behaviour import SimBehaviour
from plinth.sched.holds import Holds, verdict


@pytest.mark.parametrize(("kind", "state", "started", "met"), [
    ("after", State.PENDING, False, None), ("after", State.PENDING, True, True),
    ("after", State.RUNNING, True, True), ("after", State.CANCELLED, False, True),
    ("afterany", State.RUNNING, True, None), ("afterany", State.FAILED, True, True),
    ("afterok", State.SUCCEEDED, True, True), ("afterok", State.FAILED, True, False),
    ("afterok", State.CANCELLED, False, False), ("afterok", State.STOPPING, True, None),
    ("afternotok", State.FAILED, True, True), ("afternotok", State.SUCCEEDED, True, False),
])
def test_verdicts(kind, state, started, met) -> None:
    assert verdict(kind, state, started) is met


def plain(job_id: int) -> Job:
    """A job nothing holds: one others may wait on."""
    return Job(job_id, 0.0, 1.0, JobSpec(command=["true"]).request())


def test_an_array_throttle_lets_tasks_go_as_others_end() -> None:
    holds = Holds()
    spec = JobSpec(command=["true"], array="0-4%2", array_id=10)
    tasks = [spec.job(10 + i, "default", 0.0) for i in range(5)]
    assert (tasks[0].array_id, tasks[0].array_limit) == (10, 2)
    for t in tasks:
        holds.submitted(t, held=True)
    go, never = holds.release(lambda j: None)
    assert [j.id for j in go] == [10, 11] and never == []
    assert holds.reasons[12] == "held: array 10 runs at most 2 tasks at a time"
    assert holds.release(lambda j: None) == ([], [])
    holds.moved(tasks[0], State.SUCCEEDED)
    assert [j.id for j in holds.release(lambda j: None)[0]] == [12]


def test_array_specs_are_checked() -> None:
    assert parse_array("0-99%10") == (list(range(100)), 10)
    with pytest.raises(SpecError, match=r"^j.yaml: array: an index appears twice"):
        spec_from_dict({"command": ["true"], "array": "1,1"}, source="j.yaml")
    with pytest.raises(SpecError, match=r"^j.yaml: afterok\[0\]: must be >= 1 \(got 0\)"):
        spec_from_dict({"command": ["true"], "afterok": [0]}, source="j.yaml")


def test_sbatch_style_dependency_option() -> None:
    from plinth.cli.platform import parse_dependency
    from plinth.core.errors import PlinthError

    assert parse_dependency("afterok:12:13,after:9") == {"afterok": [12, 13], "after": [9]}
    with pytest.raises(PlinthError, match="--dependency: .* got 'singleton'"):
        parse_dependency("singleton")


def job(command, **extra) -> dict:
    return {"name": extra.pop("name", "dep"), "command": command, **extra}


def test_dependencies_hold_and_release(vp) -> None:
    vp.behave("first", SimBehaviour(exit_at=2.0))
    vp.behave("bad", SimBehaviour(exit_at=1.0, exit_code=3))
    with vp.client() as c:
        first = c.submit(job(["true"], name="first"))
        bad = c.submit(job(["true"], name="bad"))
        ok = c.submit(job(["true"], afterok=[first]))
        after = c.submit(job(["true"], after=[first]))
        never = c.submit(job(["true"], afterok=[bad]))
        anyway = c.submit(job(["true"], afterany=[bad]))
        notok = c.submit(job(["true"], afternotok=[bad]))
        vp.step()
        assert c.job(first)["state"] == "running"
        assert c.job(ok)["state"] == "pending"
        assert c.job(ok)["reason"] == f"held: dependency afterok:{first} (running)"
        assert c.job(after)["state"] == "running"  # it may start once `first` has
        vp.run_until(lambda: c.job(ok)["state"] == "succeeded", limit_s=10)
        first_ran = c.job(first)
        assert c.job(ok)["start_time"] == first_ran["end_time"] == first_ran["start_time"] + 2
        assert c.job(never)["state"] == "cancelled"
        assert c.job(never)["reason"] == (f"dependency never satisfied: afterok:{bad} "
                                         f"(job {bad} ended failed)")
        vp.advance(5)
        assert {c.job(j)["state"] for j in (after, anyway, notok)} == {"succeeded"}


def test_bad_dependencies_are_refused_at_submit(vp) -> None:
    with vp.client() as c:
        with pytest.raises(ApiError, match=r"afterok: job 999999 not found") as e:
            c.submit(job(["true"], afterok=[999999]))
        assert e.value.status == 422
        mine = c.submit(job(["true"]))
        c.set_tenant("stranger")
        with (vp.client(c.add_token("stranger")) as s,
              pytest.raises(ApiError, match=f"after: job {mine} not found")):
            s.submit(job(["true"], after=[mine]))  # another tenant's: as if not there
        with pytest.raises(ApiError, match="array_index: set by the platform"):
            c.submit(job(["true"], array_index=3))


def test_a_held_job_can_be_cancelled(vp) -> None:
    vp.behave("blocker", SimBehaviour(exit_at=30.0))
    with vp.client() as c:
        blocker = c.submit(job(["true"], name="blocker"))
        held = c.submit(job(["true"], afterok=[blocker]))
        vp.step()
        assert c.cancel(held) == "cancelled" and c.job(held)["state"] == "cancelled"
        vp.advance(40)
        assert c.job(blocker)["state"] == "succeeded"
        assert c.job(held)["state"] == "cancelled" and c.job(held)["start_time"] is None


def test_an_array_runs_each_index_with_a_throttle(shared_platform, tmp_path) -> None:
    spec = tmp_path / "array.yaml"
    spec.write_text('name: arr\narray: "0-5%2"\n'
                    'command: "echo index=$PLINTH_ARRAY_INDEX of $PLINTH_ARRAY_JOB_ID; sleep 0.3"\n')
    r = run_cli(shared_platform, "submit", "--wait", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Submitted array job" in r.stdout and "(6 tasks)" in r.stdout
    head = int(r.stdout.split()[3])
    with shared_platform.client() as c:
        tasks = c.jobs(array=head, all=True)
    assert sorted(t["array_index"] for t in tasks) == list(range(6))
    assert all(t["state"] == "succeeded" for t in tasks)
    for t in tasks:
        with shared_platform.client() as c:
            assert f"index={t['array_index']} of {head}" in c.logs(t["id"])
    # never more than 2 at a time
    spans = [(t["start_time"], t["end_time"]) for t in tasks]
    most = max(sum(s <= at < e for s, e in spans) for at, _ in spans)
    assert most <= 2
    r = run_cli(shared_platform, "ls", "-a", "--name", "arr")
    rows = [x for x in r.stdout.splitlines()[1:] if x.strip()]
    assert len(rows) == 1 and f"{head}_[0-5]" in rows[0] and "6 succeeded" in rows[0]
    r = run_cli(shared_platform, "ls", "-a", "--name", "arr", "--expand")
    assert [x.split()[0] for x in r.stdout.splitlines()[1:] if x.strip()] == \
        [f"{head}_{i}" for i in range(6)]
    r = run_cli(shared_platform, "show", f"{head}_4")
    assert r.returncode == 0 and "array_index: 4" in r.stdout


def test_a_dependency_on_an_array_waits_for_all_its_tasks(vp) -> None:
    vp.behave("arr-dep", SimBehaviour(exit_at=3.0))
    with vp.client() as c:
        head = c.submit(job(["true"], name="arr-dep", array="1-4%2"))
        after = c.submit(job(["true"], name="after-arr", afterok=[head]))
        vp.run_until(lambda: c.job(after)["state"] == "succeeded", limit_s=60)
        tasks = c.jobs(array=head, all=True)
        ends = sorted(t["end_time"] - t["start_time"] for t in tasks)
        assert len(ends) == 4 and ends == [3.0] * 4
        # two at a time (the throttle), then the dependent job once the last has ended
        assert c.job(after)["start_time"] == max(t["end_time"] for t in tasks) == \
            min(t["start_time"] for t in tasks) + 6


def test_cancelling_an_array_cancels_its_tasks(vp) -> None:
    vp.behave("arr-cancel", SimBehaviour(exit_at=30.0, ignore_term=True))  # stops in the grace
    with vp.client() as c:
        head = c.submit(job(["true"], name="arr-cancel", array="0-3%1"))
        vp.step()
        assert c.job(head)["state"] == "running"
        with served(vp) as api:
            r = run_cli(api, "cancel", str(head))
        assert r.returncode == 0, r.stderr
        # what happened to the tasks, not the state of the first one
        assert r.stdout.startswith(f"array {head}: ") and "cancelled" in r.stdout, r.stdout
        states = [t["state"] for t in c.jobs(array=head, all=True)]
        assert sorted(states) == ["cancelled"] * 3 + ["stopping"]
        vp.run_until(lambda: {t["state"] for t in c.jobs(array=head, all=True)} == {"cancelled"},
                     limit_s=30)
        assert [t["start_time"] for t in c.jobs(array=head, all=True)].count(None) == 3


def test_holds_survive_a_restart(vp) -> None:
    vp.behave("blocker", SimBehaviour(exit_at=60.0))
    with vp.client() as c:
        blocker = c.submit(job(["true"], name="blocker"))
        held = c.submit(job(["true"], afterok=[blocker]))
        vp.step()
    vp.restart(down_s=5)
    with vp.client() as c:
        assert c.job(held)["state"] == "pending"
        assert c.job(held)["reason"].startswith("held: dependency afterok:")
        assert c.job(blocker)["state"] == "running"
        c.cancel(blocker)
        vp.run_until(lambda: c.job(held)["state"] == "cancelled", limit_s=30)
        assert "never satisfied" in c.job(held)["reason"]


def test_a_step_after_one_task_ends_looks_at_one_held_job_not_all() -> None:
    """`array: 0-9999%1` (issue 36): a step costs what changed. When one task ends, the next
    one goes and that is all the release looks at; a step where nothing held could change
    looks at nothing."""
    holds = Holds()
    spec = JobSpec(command=["true"], array="0-9999%1", array_id=1, after=[99_999])
    tasks = [spec.job(1 + i, "default", 0.0) for i in range(10_000)]
    for t in tasks:
        holds.submitted(t, held=True)
    asked: list[int] = []

    def state_of(job_id: int) -> tuple[State, bool]:
        asked.append(job_id)
        return State.RUNNING, True  # `after` it: met

    go, _ = holds.release(state_of)
    assert [j.id for j in go] == [1] and len(holds.jobs) == 9_999
    for task in range(1, 50):
        asked.clear()
        holds.moved(tasks[task - 1], State.SUCCEEDED)
        go, never = holds.release(state_of)
        assert [j.id for j in go] == [task + 1] and never == []
        assert asked == [] and holds.examined == 1  # not 9,999 held jobs each step
    holds.moved(plain(424242), State.SUCCEEDED)  # another tenant's job: nothing waits on it
    assert not holds.dirty
    assert holds.reasons[9_000] == "held: array 1 runs at most 1 tasks at a time"


def test_only_the_jobs_waiting_on_a_job_that_changed_are_looked_at() -> None:
    holds = Holds()
    for i in range(1_000):
        spec = JobSpec(command=["true"], afterok=[5_000 + i])
        holds.submitted(spec.job(10_000 + i, "default", 0.0), held=True)
    asked: list[int] = []
    states = {5_000 + i: (State.RUNNING, True) for i in range(1_000)}

    def state_of(job_id: int) -> tuple[State, bool] | None:
        asked.append(job_id)
        return states[job_id]

    assert holds.release(state_of) == ([], []) and len(asked) == 1_000
    assert holds.reasons[10_007] == "held: dependency afterok:5007 (running)"
    asked.clear()
    states[5_007] = (State.SUCCEEDED, True)
    holds.moved(plain(5_007), State.SUCCEEDED)
    go, never = holds.release(state_of)
    assert [j.id for j in go] == [10_007] and never == [] and asked == [5_007]


def test_a_waiting_reason_follows_its_dependency_without_looking_at_the_job() -> None:
    holds = Holds()
    spec = JobSpec(command=["true"], afterok=[7], afterany=[8])
    holds.submitted(spec.job(20, "default", 0.0), held=True)
    assert holds.reasons[20] == "held: waiting for its turn"
    states = {7: (State.PENDING, False), 8: (State.RUNNING, True)}
    holds.release(states.get)
    assert holds.reasons[20] == "held: dependency afterany:8 (running), afterok:7 (pending)"
    states[7] = (State.RUNNING, True)
    holds.moved(plain(7), State.RUNNING)
    assert holds.release(states.get) == ([], []) and holds.examined == 0
    assert holds.reasons[20] == "held: dependency afterany:8 (running), afterok:7 (running)"


def test_a_dependency_that_can_never_be_met_is_named_in_the_specs_order() -> None:
    holds = Holds()
    job = JobSpec(command=["true"], afterok=[7, 8]).job(20, "default", 0.0)
    holds.submitted(job, held=True)
    states = {7: (State.RUNNING, True), 8: (State.RUNNING, True)}
    holds.release(states.get)
    states[7] = states[8] = (State.FAILED, True)
    holds.moved(plain(8), State.FAILED)  # told of 8 first; 7 comes first in the spec
    holds.moved(plain(7), State.FAILED)
    why = "dependency never satisfied: afterok:7 (job 7 ended failed)"
    assert holds.release(states.get) == ([], [(20, why)])
    holds.moved(job, State.CANCELLED)  # as the owner cancels it
    assert not holds.jobs and not holds.waiters


def test_an_array_waiting_on_a_dependency_then_goes_at_its_throttle() -> None:
    holds = Holds()
    spec = JobSpec(command=["true"], array="0-3%2", array_id=30, afterok=[9])
    tasks = {30 + i: spec.job(30 + i, "default", 0.0) for i in range(4)}
    for t in tasks.values():
        holds.submitted(t, held=True)
    states = {9: (State.RUNNING, True)}
    assert holds.release(states.get) == ([], [])
    assert holds.reasons[32] == "held: dependency afterok:9 (running)"
    states[9] = (State.SUCCEEDED, True)
    holds.moved(plain(9), State.SUCCEEDED)
    assert [j.id for j in holds.release(states.get)[0]] == [30, 31]
    assert holds.reasons[33] == "held: array 30 runs at most 2 tasks at a time"
    assert holds.tallies[30].state() == (State.PENDING, False)
    holds.moved(tasks[30], State.RUNNING)
    assert holds.tallies[30].state() == (State.RUNNING, True)
    for task in (32, 33):  # cancelled while held: nothing of the array is left behind
        holds.moved(tasks[task], State.CANCELLED)
    holds.moved(tasks[30], State.SUCCEEDED)
    holds.moved(tasks[31], State.SUCCEEDED)
    assert holds.tallies[30].state() == (State.FAILED, True)  # two were cancelled
    assert holds.release(states.get) == ([], []) and not holds.arrays and not holds.jobs
    holds.drop_ended_arrays()
    assert not holds.tallies
