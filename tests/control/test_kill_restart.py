"""Exactly once across kill -9 (issue 36, finding 8): a root `plinth up` killed with SIGKILL 5
times while two tenants submit 200 jobs and cancel every 7th; no accepted job is lost, none runs
twice, nothing is left running. bench/kill_restart.py is the full-size run (1,500 jobs, 20
kills); the run and its audit are restart_chaos.py's."""

from __future__ import annotations

import os

import pytest
from restart_chaos import Params, run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="tenants' jobs run as their own Unix users "
                                                 "only under a root control plane"),
]


def test_no_job_is_lost_or_run_twice_across_kill_9s():
    a = run(Params(jobs=200, kills=5, seed=3))
    assert a.kills == 5
    assert a.accepted == 200 and not a.duplicated, a.duplicated
    assert a.lost == [], f"accepted but not stored or not terminal: {a.lost}"
    assert a.ran_twice == [], "\n".join(a.details)
    assert a.orphans == [], a.orphans
    # Every command exits 0, so each job either ran to its end or was cancelled: a run in which
    # nothing started would pass the checks above and prove nothing.
    assert set(a.states) <= {"succeeded", "cancelled"}, (a.states, a.details)
    assert a.never_ran == [], f"succeeded without their command ending: {a.never_ran}"
    assert a.states["succeeded"] > 0 and a.starts >= a.states["succeeded"]
