"""Exactly once across kill -9: a root `plinth up` killed with SIGKILL and restarted while two
tenants submit and cancel short jobs; then lost jobs, jobs run twice and orphans are counted
(issue 36, finding 8).

    .venv/bin/python bench/kill_restart.py [--jobs 1500] [--kills 20] [--seed 0] [--threads 2]
        [--src LABEL=SRC ...] [--json F]

Needs root: tenants' jobs run as their own Unix users (made once, plinth-crash-a and -b). The
run and its audit are tests/control/restart_chaos.py's (the slow test runs a small one): each job
appends `start JOB ATTEMPT` and `end JOB ATTEMPT` to a file in its tenant's folder around a sleep
of up to 0.33 s (every 5th: 1-5 s, so that restarts find some still running); every 7th is
cancelled right after it is accepted; the control plane is killed when the accepted submissions
reach points drawn from the seed, and restarted on the same home and port; an unanswered
submission is looked up by its unique name before it is sent again.

`--src LABEL=SRC` runs the control plane (and its shims) from another source tree's src/ (an
export of an older commit, say), with the same seed, as one more column; `--src here=.` is this
checkout. Without --src, this checkout alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "control")]

from restart_chaos import Audit, Params, run  # from tests/control, on the path above

ROWS = (  # (label, value of an Audit, what it should be)
    ("submissions accepted (answered 2xx / found by name)",
     lambda a: f"{a.accepted} ({a.answered} / {a.found_by_name})", ""),
    ("submissions without an answer (looked up, then sent again if absent)",
     lambda a: str(a.unanswered), ""),
    ("cancels sent", lambda a: str(a.cancels), ""),
    ("kill -9s of the control plane", lambda a: str(a.kills), ""),
    ("at restarts: running re-adopted / ended while down / lost and requeued",
     lambda a: " / ".join(str(a.recovered.get(k, 0)) for k in
                          ("running re-adopted", "ended while down", "lost and requeued")), ""),
    ("jobs succeeded / cancelled / failed",
     lambda a: " / ".join(str(a.states.get(k, 0)) for k in ("succeeded", "cancelled", "failed")),
     "failed 0"),
    ("jobs by attempt (0: never launched)",
     lambda a: ", ".join(f"{k}: {n}" for k, n in sorted(a.attempts.items())), ""),
    ("commands started", lambda a: str(a.starts), ""),
    ("lost (accepted, not stored or not terminal)", lambda a: str(len(a.lost)), "0"),
    ("one submission stored twice", lambda a: str(len(a.duplicated)), "0"),
    ("jobs whose command started twice", lambda a: str(len(a.ran_twice)), "0"),
    ("  of which ran to completion twice", lambda a: str(len(a.completed_twice)), "0"),
    ("succeeded without its command ending", lambda a: str(len(a.never_ran)), "0"),
    ("orphans (job processes or shims left)", lambda a: str(len(a.orphans)), "0"),
    ("wall time (s)", lambda a: f"{a.wall_s:.0f}", ""),
)


def table(audits: dict[str, Audit], p: Params) -> Table:
    t = Table(title=f"kill -9 during {p.jobs} submissions and cancels: {p.kills} kills, "
                    f"seed {p.seed}, {p.threads} client threads")
    t.add_column("")
    for label in audits:
        t.add_column(label, justify="right")
    t.add_column("target", justify="right")
    for label, value, target in ROWS:
        t.add_row(label, *(value(a) for a in audits.values()), target)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1500)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--src", action="append", default=[], metavar="LABEL=SRC",
                    help="run the control plane from this src/ folder (repeatable)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/kill_restart.py needs root: tenants' jobs run as their own Unix users")
    trees = [s.split("=", 1) for s in args.src] or [["this checkout", "."]]
    audits: dict[str, Audit] = {}
    console = Console()
    for label, src in trees:
        p = Params(jobs=args.jobs, kills=args.kills, seed=args.seed, threads=args.threads,
                   server_src=None if src == "." else str(Path(src).resolve()))
        console.print(f"{label}: control plane from {p.server_src or ROOT / 'src'}",
                      highlight=False)
        audits[label] = run(p)
        for line in audits[label].details + audits[label].orphans:
            console.print(f"  {label}: {line}", highlight=False)
    console.print(table(audits, p))
    console.print(f"load average at the end: {psutil.getloadavg()[0]:.1f} on "
                  f"{psutil.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps({k: a.to_dict() for k, a in audits.items()},
                                              indent=2))


if __name__ == "__main__":
    main()
