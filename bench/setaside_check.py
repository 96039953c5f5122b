"""How often setting waiting jobs aside after arrivals decides otherwise than a whole pass.

    python bench/setaside_check.py [--trace PATH] [--cluster 32x8xV100] [--policies tiresias,drf]
                                   [--window 0d:30d]

A policy that reads `Snapshot.arrived` (Tiresias, DRF) walks only the new jobs in a pass that
follows arrivals alone. Here every such pass is also made as a whole pass on the same
snapshot (the policy's carried state put back after it), and the two are compared: the jobs
started and preempted, and the wake-up the owner holds after each (the earliest asked for
since the last one fired). The replay itself goes on with the set-aside pass's decisions.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from rich.table import Table

from plinth.core.spec import load_cluster
from plinth.sched.owner import Owner
from plinth.sched.policies import make_policy
from plinth.sim import report
from plinth.sim.engine import simulate
from plinth.sim.run import sched_config

from philly_common import add_replay_args, philly


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replay_args(ap, "tiresias,drf")
    args = ap.parse_args()
    cluster, jobs = load_cluster(args.cluster), philly(args.trace, args.window).jobs
    rows = [_check(jobs, cluster, name) for name in args.policies.split(",")]
    table = Table(title=f"Set-aside passes against whole passes, {len(jobs):,} jobs, "
                        f"{cluster.describe()}")
    for key in rows[0]:
        table.add_column(key, justify="left" if key == "policy" else "right")
    for row in rows:
        table.add_row(*(f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()))
    report.console().print(table)


def _check(jobs, cluster, name: str) -> dict:
    """One replay of `name`, each set-aside pass compared with a whole pass."""
    policy = make_policy(name)
    if not policy.reads_arrivals:
        sys.exit(f"{name}: does not read Snapshot.arrived, so sets nothing aside")
    inner, held = policy.schedule, [None]
    n = {"passes": 0, "after arrivals": 0, "other starts": 0, "other preempts": 0,
         "other wake": 0}

    def held_wake(owner_pass):  # the owner's wake-up before each pass
        def wrapped(self, now, arrived=None):  # type: ignore[no-untyped-def]
            held[0] = self.wake_at
            return owner_pass(self, now, arrived)
        return wrapped

    def checked(snap, now):  # type: ignore[no-untyped-def]
        n["passes"] += 1
        d = inner(snap, now)
        if snap.arrived is None:
            return d
        n["after arrivals"] += 1
        carried = policy._carry
        whole = inner(dataclasses.replace(snap, arrived=None), now)
        policy._carry = carried
        n["other starts"] += _ids(d.starts) != _ids(whole.starts)
        n["other preempts"] += _ids(d.preempts) != _ids(whole.preempts)
        n["other wake"] += _earliest(held[0], d.wake_at) != _earliest(held[0], whole.wake_at)
        return d

    policy.schedule = checked  # type: ignore[method-assign]
    owner_pass, Owner._pass = Owner._pass, held_wake(Owner._pass)  # type: ignore[method-assign]
    try:
        simulate(jobs, cluster, policy, sched_config())
    finally:
        Owner._pass = owner_pass  # type: ignore[method-assign]
    return {"policy": name, **n}


def _ids(decisions) -> list[int]:  # type: ignore[no-untyped-def]
    return sorted(x.job_id for x in decisions)


def _earliest(*times: float | None) -> float | None:
    return min((t for t in times if t is not None), default=None)


if __name__ == "__main__":
    main()
