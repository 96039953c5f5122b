"""SLICE-TUNE's tuning time: one exclusive tuning server against N servers on shares with K
sharded clients, at the same trial budget, and the latency the tuned model reaches.

- exclusive: 1 server on the whole machine (2 cores, 2 threads), 1 client, all tasks;
- shared: N servers on 1-core shares (the runtime pins one to each core), K clients, each
  tuning its shard of the tasks (`plinth.tune.plan.shard`), measuring on those servers.

Both tune the same small CNN as bench/tune_matrix.py with the same number of trials in all.
Latency: the tuned model run at 1 core and at 2 cores (median ms of 15 repeats).

    python bench/tune_time.py [--trials 32] [--servers 2] [--clients 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tune_common import latency, meta_seconds, model_args, run_spec

from plinth.tune.spec import TuneSpec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(p, trials=32, per_iter=16)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--builder", default="inline", choices=("local", "inline"))
    p.add_argument("--json", default="results/tune_time.json")
    p.add_argument("--workdir", default=None)
    p.add_argument("--reuse", action="store_true",
                   help="a configuration already tuned in --workdir is timed, not tuned again")
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tune-time-"))
    base = TuneSpec.model_validate({
        "name": "exclusive", "model": args.model, "target": "cpu", "shares": [2],
        "input_shape": [int(d) for d in args.input_shape.split(",")], "trials": args.trials,
        "trials_per_iter": args.trials_per_iter, "seed": args.seed, "builder": args.builder})
    shared = base.model_copy(update={"name": "shared", "shares": [1.0],
                                     "servers": args.servers, "clients": args.clients})
    # Shared first: should the machine's other load fall while this runs, it favours the
    # exclusive run that follows, not the claim.
    # The runtime pins each server to its share's least loaded cores: the shared servers one
    # to a core, the exclusive one to both.
    configs = {"shared": shared, "exclusive": base}
    rows = {}
    for name, spec in configs.items():
        db = work / name
        # Wall time of the task; with --reuse, for a configuration tuned before in --workdir,
        # that of its slowest client, from the clients' own records (the tracker's start left
        # out).
        done = len(meta_seconds(db)) == spec.clients * len(spec.shares)
        wall = None if args.reuse and done else run_spec(spec, db).seconds
        wall = wall if wall is not None else max(meta_seconds(db, "seconds"))
        share = spec.shares[0]
        ms1 = statistics.median(latency(db, spec, [share], 1, "1")[share])
        ms2 = statistics.median(latency(db, spec, [share], 2, "0-1")[share])
        rows[name] = {"servers": spec.servers, "clients": spec.clients, "share": share,
                      "wall_s": wall, "client_tune_s": meta_seconds(db),
                      "ms_at_1": ms1, "ms_at_2": ms2}
    t = Table(title=f"{args.model}: tuning time at {args.trials} trials in all")
    for col in ("config", "servers x share", "clients", "wall s", "vs exclusive",
                "ms at 1 core", "ms at 2 cores"):
        t.add_column(col, justify="left" if col == "config" else "right")
    ref = rows["exclusive"]["wall_s"]
    for name, r in sorted(rows.items(), key=lambda kv: kv[0] != "exclusive"):
        t.add_row(name, f"{r['servers']} x {r['share']:g} core", str(r["clients"]),
                  f"{r['wall_s']:.0f}", f"{(r['wall_s'] - ref) / ref:+.0%}",
                  f"{r['ms_at_1']:.3f}", f"{r['ms_at_2']:.3f}")
    Console().print(t)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"trials": args.trials, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
