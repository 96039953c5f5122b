"""Bringing running jobs up to date: the owner's Python loop against numpy with a write-back.

    python bench/accounting_vectorised.py [--jobs 50,150,1000] [--repeat 20000]

Before each pass the owner brings every launched running job's progress, attained service
and run time up to date (`plinth.sched.accounting.account`). Keeping the runs' constants as
arrays would compute the three with a few numpy calls, but the policies read them from each
`JobState`, so they must still be written back one job at a time. This measures both ways on
the same runs, to say whether that change would pay at the sizes a pass sees (the Philly
replay runs about 150 jobs at a time).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from plinth.core.resources import Request
from plinth.core.workload import Job
from plinth.sched.accounting import Run, account
from plinth.sched.types import JobState


def _runs(n: int) -> list[tuple[JobState, Run, float]]:
    out = []
    for i in range(n):
        js = JobState(Job(i, 0.0, 5_000.0 + i, Request(gpus=1)))
        # Checkpoints every 600 s of progress, as the simulator's jobs declare.
        out.append((js, Run(100.0 + i, 130.0 + i, 1.0, 600.0, 0.0, 0.0, 0.0, 1.0),
                     js.job.duration))
    return out


def _loop_us(jobs: list[tuple[JobState, Run, float]], repeat: int) -> float:
    t = time.perf_counter()
    for k in range(repeat):
        account(jobs, 1_000.0 + k * 0.01)
    return (time.perf_counter() - t) / repeat * 1e6


def _numpy_us(jobs: list[tuple[JobState, Run, float]], repeat: int) -> float:
    states = [js for js, _, _ in jobs]
    t0 = np.array([r.t0 for _, r, _ in jobs])
    start = np.array([r.start for _, r, _ in jobs])
    rate = np.array([r.rate for _, r, _ in jobs])
    gpus = np.array([r.gpus for _, r, _ in jobs])
    base_p = np.array([r.base_progress for _, r, _ in jobs])
    base_a = np.array([r.base_attained for _, r, _ in jobs])
    base_e = np.array([r.base_executed for _, r, _ in jobs])
    duration = np.array([d for _, _, d in jobs])
    every = np.array([r.every for _, r, _ in jobs])
    saved = np.zeros(len(jobs))  # what each job's last checkpoint saved, kept as an array
    t = time.perf_counter()
    for k in range(repeat):
        now = 1_000.0 + k * 0.01
        ran = now - t0
        progress = np.minimum(np.where(ran > 0, base_p + rate * ran, base_p), duration)
        ran = now - start
        attained, executed = base_a + gpus * ran, base_e + ran
        for js, p, a, e in zip(states, progress.tolist(), attained.tolist(),
                               executed.tolist()):
            js.progress, js.attained, js.executed = p, a, e
        for i in ((every > 0) & (progress - saved >= every)).nonzero()[0].tolist():
            js, run = states[i], jobs[i][1]  # a checkpoint is due: as `account` writes it
            saved[i] = js.checkpointed = np.floor(progress[i] / every[i]).item() * every[i].item()
            js.checkpoint_time = run.t0 + (saved[i].item() - run.base_progress) / run.rate
    return (time.perf_counter() - t) / repeat * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="50,150,1000")
    ap.add_argument("--repeat", type=int, default=20_000)
    args = ap.parse_args()
    table = Table(title="Bringing running jobs up to date, µs per pass")
    for col in ("running jobs", "Python loop (account)", "numpy + write-back", "ratio"):
        table.add_column(col, justify="right")
    for n in (int(x) for x in args.jobs.split(",")):
        repeat = max(args.repeat * 150 // n, 100)
        loop, vec = _loop_us(_runs(n), repeat), _numpy_us(_runs(n), repeat)
        table.add_row(f"{n:,}", f"{loop:.1f}", f"{vec:.1f}", f"{vec / loop:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
