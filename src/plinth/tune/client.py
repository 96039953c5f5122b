"""`python -m plinth.tune.client --shard i/K ...`: a tuning client, one shard at one share.

It extracts the model's tasks (every client gets the same list), keeps its shard, and tunes it
with MetaSchedule: search and builds here, measurements on the share's servers through the RPC
runner. Records go to its own JSON database as they are measured (see `plinth.tune.db`); when its
shard is done, it reports what it tuned to its controller (`plinth.tune.reports.Tuned`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from plinth.core.net import host_port
from plinth.tune.db import TunedRecords, shard_dir, write_meta
from plinth.tune.plan import budget, parse_shard, shard, share_key
from plinth.tune.reports import REPORT_WAIT_S, Tuned, send

BUILD_TIMEOUT_S = 120.0  # per candidate; a loaded 2-core machine compiles slowly
SESSION_TIMEOUT_S = 120  # per measurement, upload and queueing for a server included


def _shape(text: str) -> list[int]:
    return [int(d) for d in text.split(",")]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m plinth.tune.client", description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--input-shape", required=True, type=_shape)
    p.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--share", required=True, type=float)
    p.add_argument("--shard", default="0/1", type=parse_shard)
    p.add_argument("--servers", type=int, default=1, help="measurements in flight at once")
    p.add_argument("--trials", required=True, type=int, help="for the whole model")
    p.add_argument("--trials-per-iter", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--builder", choices=("local", "inline"), default="local",
                   help="local: MetaSchedule's pool of build processes; inline: in this one")
    p.add_argument("--db", required=True, type=Path)
    p.add_argument("--tracker", required=True, type=host_port, help="the tracker's HOST:PORT")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    index, count = args.shard
    out = shard_dir(args.db, args.model, args.input_shape, args.target, args.share, index,
                    count)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    from plinth.tune.target import light_tensor_intrins, target_for

    light_tensor_intrins(args.target)  # before MetaSchedule makes its first TuneContext
    from tvm.s_tir import meta_schedule as ms

    from plinth.tune.model import describe, extract
    from plinth.tune.target import build_candidate, inline_builder

    target = target_for(args.target, args.share)
    _, tasks = extract(args.model, args.input_shape, target)
    mine = shard(describe(tasks), count)[index]
    trials = budget(args.trials, len(mine), len(tasks))
    meta = {"model": args.model, "input_shape": args.input_shape, "target": target,
            "share": args.share, "shard": [index, count], "seed": args.seed,
            "tasks": [tasks[i].task_name for i in mine], "trials": trials}
    if mine:
        host, port = args.tracker
        cores = len(os.sched_getaffinity(0))
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            [tasks[i] for i in mine], str(out), num_threads=cores,
            seed=args.seed + 7919 * index)
        runner = ms.runner.RPCRunner(
            ms.runner.RPCConfig(host, port, share_key(args.share),
                                session_timeout_sec=SESSION_TIMEOUT_S),
            ms.runner.EvaluatorConfig(number=5, repeat=3, min_repeat_ms=20),
            max_workers=args.servers)
        builder = inline_builder() if args.builder == "inline" else ms.builder.LocalBuilder(
            max_workers=cores, timeout_sec=BUILD_TIMEOUT_S, f_build=build_candidate)
        database = ms.database.JSONDatabase(work_dir=str(out))
        tuned = time.monotonic()
        ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=str(out),
                      max_trials_global=trials, num_trials_per_iter=args.trials_per_iter,
                      builder=builder, runner=runner, database=database)
        meta["tune_seconds"] = time.monotonic() - tuned
    meta["seconds"] = time.monotonic() - started
    write_meta(out, meta)
    send(Tuned(tasks=len(mine), trials=trials, records=TunedRecords(args.share, (out,)).count(),
               seconds=meta["seconds"], tune_seconds=meta.get("tune_seconds")),
         wait_s=REPORT_WAIT_S)


if __name__ == "__main__":
    main()
