"""Shared by bench/tune_matrix.py and bench/tune_time.py: run a Tune spec on this machine
through the control plane, and time a tuned model at a CPU share in a process of its own."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# The tests' in-process platform (a ControlPlane on a LocalRuntime, as `plinth up` runs): the
# scheduler places the units, and the runtime pins each server to its share's CPUs.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "tune"))
from tune_local import Outcome
from tune_local import run_spec as run_local

from plinth.tune.spec import TuneSpec


def model_args(p: argparse.ArgumentParser, *, trials: int, per_iter: int) -> None:
    """The options the tuning benches share: the model, its input and the trial budget."""
    p.add_argument("--model", default="plinth.tune.models:small_cnn")
    p.add_argument("--input-shape", default="1,3,32,32")
    p.add_argument("--trials", type=int, default=trials)
    p.add_argument("--trials-per-iter", type=int, default=per_iter)


def run_spec(spec: TuneSpec, db: Path) -> Outcome:
    """Tune `spec` into `db`; the platform's state and the units' logs go beside it."""
    home = db.parent / f"platform-{db.name}"
    out = run_local(spec, db, home, timeout_s=3000)
    if out.state != "succeeded":
        raise SystemExit(f"tuning {spec.name} ended {out.state}; logs in {home / 'logs'}")
    return out


def latency(db: Path, spec: TuneSpec, tuned_at: list[float], threads: int, cpus: str,
            repeat: int = 15) -> dict[float, list[float]]:
    """Per-round ms of the model built with the records tuned at each of `tuned_at`, run in
    turns with `threads` threads pinned to `cpus` (paired: the same load falls on each)."""
    cmd = [sys.executable, "-m", "plinth.tune.build", "--db", str(db), "--model", spec.model,
           "--input-shape", ",".join(map(str, spec.input_shape)), "--target", spec.target,
           "--share", ",".join(f"{s:g}" for s in tuned_at), "--threads", str(threads),
           "--cpus", cpus, "--repeat", str(repeat)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    ms = json.loads(done.stdout.strip().splitlines()[-1])["ms"]
    return {float(k): v for k, v in ms.items()}


def meta_seconds(db: Path, field: str = "tune_seconds") -> list[float]:
    """Seconds of every shard's client, from its meta.json: `tune_seconds` (tuning alone) or
    `seconds` (from its start, imports and task extraction included)."""
    return [json.loads(p.read_text()).get(field, 0.0) for p in sorted(db.rglob("meta.json"))]
