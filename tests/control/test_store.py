from __future__ import annotations

import pytest

from plinth.core.lifecycle import TRANSITIONS, IllegalTransition, State, check_transition
from plinth.control.store import Event, Store
from plinth.core.errors import PlinthError


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path) -> Store:
    if request.param == "sqlite":
        s = Store(str(tmp_path / "plinth.db"))
    else:
        url = request.getfixturevalue("postgres_url")
        s = Store(url)
        from plinth.control.store import metadata

        metadata.drop_all(s.engine)  # a fresh schema per test on the shared server
        metadata.create_all(s.engine)
    yield s
    s.close()


def _row(name: str = "j") -> dict:
    return {"name": name, "tenant": "default", "priority": 0, "spec": {"command": ["true"]}}


def test_job_lifecycle_with_events(store: Store) -> None:
    store.put_tenant("default", None, None)
    a = store.insert_job(_row("a"), now=1.0)
    b = store.insert_job(_row("b"), now=2.0)
    assert b > a
    store.transition(a, State.PENDING, State.RUNNING, 3.0, "started", "attempt 1",
                     attempt=1, start_time=3.0, allocation={"slots": []})
    store.transition(a, State.RUNNING, State.SUCCEEDED, 4.0, "succeeded", "exit code 0",
                     exit_code=0, end_time=4.0)
    row = store.job(a)
    assert row["state"] == "succeeded" and row["exit_code"] == 0 and row["attempt"] == 1
    assert [e["kind"] for e in store.events(a)] == ["submitted", "started", "succeeded"]
    assert [r["id"] for r in store.active_jobs()] == [b]
    assert {r["id"] for r in store.jobs()} == {a, b}
    store.add_events([Event(b, "note", "hello")], now=5.0)
    assert store.events(b)[-1]["message"] == "hello"


def test_transition_guards_the_old_state(store: Store) -> None:
    store.put_tenant("default", None, None)
    a = store.insert_job(_row(), now=1.0)
    with pytest.raises(IllegalTransition):
        store.transition(a, State.PENDING, State.SUCCEEDED, 2.0, "x")
    with pytest.raises(PlinthError, match="does not hold it as running"):
        store.transition(a, State.RUNNING, State.SUCCEEDED, 2.0, "x")
    assert store.job(a)["state"] == "pending"
    assert [e["kind"] for e in store.events(a)] == ["submitted"]  # nothing half-written


def test_tokens_are_stored_hashed(store: Store) -> None:
    store.put_tenant("research", 2.0, None)
    store.add_token("secret-token", "research")
    tokens = store.tokens()
    assert "secret-token" not in tokens and list(tokens.values()) == [("research", False, None)]
    assert store.tenants() == [{"name": "research", "gpus": 2.0, "borrowing_limit": None,
                                "unix_user": None}]


def test_a_tenant_with_jobs_and_tokens_can_be_updated(store: Store) -> None:
    """Found by the API fuzzer: PUT on a tenant that owns a token broke its foreign key."""
    store.put_tenant("default", 1.0, None)
    store.add_token("t0k3n", "default")
    store.insert_job(_row("a"), now=1.0)
    store.put_tenant("default", 4.0, 2.0)
    assert store.tenants() == [{"name": "default", "gpus": 4.0, "borrowing_limit": 2.0,
                                "unix_user": None}]
    assert [t for t, _, _ in store.tokens().values()] == ["default"]


def test_transition_table_is_closed() -> None:
    for old, targets in TRANSITIONS.items():
        for new in State:
            if new in targets:
                check_transition(1, old, new)
            else:
                with pytest.raises(IllegalTransition):
                    check_transition(1, old, new)
    assert all(not TRANSITIONS[s] for s in State if s.terminal)


def test_bad_db_url_is_one_line() -> None:
    with pytest.raises(PlinthError, match="--db"):
        Store("nosuchdialect://x")


def test_many_transitions_are_one_transaction_in_order(store: Store) -> None:
    from plinth.control.store import Transition

    store.put_tenant("default", None, None)
    ids = store.insert_jobs([(_row(f"t{i}"), 1.0, "") for i in range(300)], array=True)
    cancel = [Transition(j, State.PENDING, State.CANCELLED, 2.0, "cancelled", "by the user",
                         {"end_time": 2.0, "reason": "cancelled"}) for j in ids[1:]]
    # a job's moves in a row keep their order, across runs of like moves
    first = [Transition(ids[0], State.PENDING, State.RUNNING, 2.0, "started", "", {"attempt": 1}),
             Transition(ids[0], State.RUNNING, State.PENDING, 2.5, "preempted"),
             Transition(ids[0], State.PENDING, State.RUNNING, 3.0, "started", "",
                        {"attempt": 2})]
    store.transitions([*first, *cancel])
    assert store.array_summary(ids[0]) == ({State.RUNNING, State.CANCELLED}, True)
    assert store.job(ids[7])["reason"] == "cancelled" and store.job(ids[0])["attempt"] == 2
    assert [e["kind"] for e in store.events(ids[0])] == ["submitted", "started", "preempted",
                                                         "started"]
    with pytest.raises(PlinthError, match="does not hold all 2 as pending"):
        store.transitions([Transition(j, State.PENDING, State.CANCELLED, 4.0, "cancelled")
                           for j in (ids[0], ids[1])])
    assert store.job(ids[0])["state"] == "running"  # none of them
