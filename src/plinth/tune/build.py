"""Build a model with the records tuned at the share nearest to its own, and time it.

    ex = build(db, model, input_shape, "cpu", share=2)    # a Relax VM executable
    python -m plinth.tune.build --db DB --model M --input-shape 1,3,32,32 --share 1,2 \
        --threads 1 --cpus 0      # latency at another share, of the records of each, as JSON

A Service replica at share s builds with `build(..., share=s)`; the cross-share matrix runs
the second form, tuned at one share and run at another, in a process of its own (the TVM
thread pool is sized once per process).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plinth.tune.db import model_key, records_for


def build(db: str | Path, model: str, input_shape: Sequence[int], target: str, share: float,
          *, exact: bool = False) -> tuple[Any, float]:
    """(executable, share its records were tuned at); `exact` refuses a nearest share."""
    from tvm.s_tir import meta_schedule as ms

    from plinth.tune.model import lower, relax_module
    from plinth.tune.target import target_for

    rec = records_for(db, model_key(model, input_shape), target, share)
    if rec is None or (exact and rec.share != share):
        raise LookupError(f"{model} at {tuple(input_shape)} is not tuned on {target}"
                          + (f" at share {share:g}" if exact else "") + f" in {db}")
    tgt = target_for(target, share)
    lowered = lower(relax_module(model, tuple(input_shape)), tgt)
    return ms.relax_integration.compile_relax(rec.database(), lowered, tgt, None), rec.share


def latency_ms(executable: Any, input_shape: Sequence[int], *, number: int = 20,
               repeat: int = 15) -> list[float]:
    """Milliseconds per run, one figure per repeat (each the mean of `number` runs)."""
    import tvm
    from tvm import relax

    from plinth.tune.model import example_input

    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    x = tvm.runtime.tensor(example_input(input_shape), dev)
    timer = vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=0)
    return [r * 1e3 for r in timer(x).results]


def main(argv: list[str] | None = None) -> None:
    from plinth.tune.server import parse_cpus

    p = argparse.ArgumentParser(prog="python -m plinth.tune.build", description=__doc__)
    p.add_argument("--db", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--input-shape", required=True)
    p.add_argument("--target", default="cpu")
    p.add_argument("--share", required=True, help="records tuned at this share; several "
                   "(1,2): each is built, and they are timed in turns, so that a change in "
                   "the machine's load falls on all of them alike")
    p.add_argument("--threads", type=int, required=True, help="the share run at")
    p.add_argument("--cpus", type=parse_cpus, default=None)
    p.add_argument("--number", type=int, default=20)
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before TVM starts its thread pool
    shape = [int(d) for d in args.input_shape.split(",")]
    shares = [float(s) for s in args.share.split(",")]
    built = {s: build(args.db, args.model, shape, args.target, s, exact=True)[0]
             for s in shares}
    runs: dict[str, list[float]] = {f"{s:g}": [] for s in shares}
    for _ in range(args.repeat):
        for s, ex in built.items():
            runs[f"{s:g}"] += latency_ms(ex, shape, number=args.number, repeat=1)
    print(json.dumps({"threads": args.threads, "ms": runs}))


if __name__ == "__main__":
    main()
