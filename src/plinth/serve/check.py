"""Whether a Service's model can serve: load it, run one example, time it (`check_model`), in a
child process, so that a user's factory that crashes, hangs or exits cannot harm the caller."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from plinth.core.errors import SpecError

CHECK_TIMEOUT_S = 120.0  # loading a model and running one example, in check_model
TUNED_CHECK_TIMEOUT_S = 300.0  # the same, with TVM's import and build of a tuned model


def _shape(input_shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1:
        raise SpecError(f"input_shape: expected positive integers, got {list(input_shape)}")
    return shape


Tuned = tuple[str, str, float]  # a Service's tuned model: (database, target, replica share)


def check_model_here(ref: str, input_shape: tuple[int, ...] | list[int], slo_ms: float,
                     workdir: str | None = None, tuned: Tuned | None = None) -> float:
    """`check_model` in this process: it imports and runs the user's code here."""
    import torch  # here: `check_model`, which `plinth submit` runs, never imports torch

    from plinth.serve.batching import time_forward
    from plinth.serve.model import forward_fn, load_model, try_example

    shape = _shape(input_shape)
    if tuned is None:
        forward = forward_fn(load_model(ref, workdir=workdir))
    else:
        from plinth.serve.tuned import tuned_forward

        db, target, share = tuned
        forward, _ = tuned_forward(db, ref, shape, target, share, workdir=workdir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        try_example(forward, shape)
        latency_ms = time_forward(forward, torch.zeros((1, *shape)))
    finally:
        torch.set_num_threads(threads)
    if slo_ms < latency_ms:
        raise SpecError(f"slo_ms: {slo_ms:g} ms is below the model's measured single-request "
                        f"latency {latency_ms:.1f} ms")
    return latency_ms


def check_model(ref: str, input_shape: tuple[int, ...] | list[int], slo_ms: float,
                workdir: str | None = None, *, tuned: Tuned | None = None,
                timeout_s: float | None = None) -> float:
    """Load `ref`, run one example, and return its single-request latency in ms (the median of a
    few timed runs, on one torch thread as a replica runs it). Raises a one-line `SpecError`
    when the model cannot load, refuses the input, or cannot meet `slo_ms` even unbatched.

    With `tuned` (database, target, share) the model is the TVM build a replica at that share
    serves (`plinth.serve.tuned`): the database is checked here first, without TVM, and the
    child builds and times it with the share's threads.

    The user's code runs in a child process (in `workdir`, without the PLINTH_* variables), so
    that a factory that crashes, hangs, exits or imports a module of a common name cannot harm
    or confuse the caller, which is the control plane."""
    shape = _shape(input_shape)
    if workdir is not None and not Path(workdir).is_dir():
        raise SpecError(f"workdir: no such directory {workdir!r}")
    cmd = [sys.executable, "-m", "plinth.serve.check", ref, ",".join(map(str, shape)),
           repr(float(slo_ms)), *(["--workdir", workdir] if workdir else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLINTH_")}
    env["OMP_NUM_THREADS"] = "1"
    if tuned is not None:
        from plinth.serve.tuned import check_tuned

        db, target, share = tuned
        check_tuned(db, ref, shape, target, share)
        cmd += ["--tuned-db", db, "--tuned-target", target, "--share", f"{share:g}"]
    if timeout_s is None:
        timeout_s = CHECK_TIMEOUT_S if tuned is None else TUNED_CHECK_TIMEOUT_S
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=timeout_s, env=env, cwd=workdir,
                              check=False)
    except subprocess.TimeoutExpired:
        raise SpecError(f"model: loading it and running one example took over {timeout_s:g} s"
                        ) from None
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        err = done.stderr.decode(errors="replace").strip().splitlines()
        raise SpecError(f"model: the check exited with {done.returncode}: "
                        f"{err[-1] if err else 'no output'}") from None
    if "error" in answer:
        raise SpecError(answer["error"])
    return float(answer["latency_ms"])


def _check_main(argv: list[str]) -> None:
    """The child of `check_model`: one JSON line, the latency or the error."""
    from plinth.serve.model import _first_line, parse_shape

    ap = argparse.ArgumentParser(prog="python -m plinth.serve.check")
    ap.add_argument("ref")
    ap.add_argument("input_shape")
    ap.add_argument("slo_ms", type=float)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--tuned-db", default=None)
    ap.add_argument("--tuned-target", default="cpu")
    ap.add_argument("--share", type=float, default=1.0)
    args = ap.parse_args(argv)
    tuned = None if args.tuned_db is None else (args.tuned_db, args.tuned_target, args.share)
    try:
        ms = check_model_here(args.ref, parse_shape(args.input_shape), args.slo_ms, args.workdir,
                              tuned)
        answer: dict[str, Any] = {"latency_ms": ms}
    except SpecError as e:
        answer = {"error": str(e)}
    except Exception as e:  # noqa: BLE001 -- whatever the user's code raised, say it in one line
        answer = {"error": f"model: {_first_line(e)}"}
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    _check_main(sys.argv[1:])
