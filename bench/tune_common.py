"""Shared by bench/tune_matrix.py and bench/tune_time.py: run a Tune spec on this machine and
time a tuned model at a CPU share in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# The tests' launcher (a process group per unit, CPU pinning by unit name): a benchmark, as a
# test, plays the runtime's part.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "tune"))
from tune_launch import Launcher

from plinth.tune.run import Outcome, tune
from plinth.tune.spec import TuneSpec


def run_spec(spec: TuneSpec, db: Path, cpus: dict[str, set[int]]) -> Outcome:
    out = tune(spec, db, launch=Launcher(db.parent / f"logs-{db.name}", cpus), timeout_s=3000)
    if out.state.value != "succeeded":
        raise SystemExit(f"tuning {spec.name} ended {out.state.value}; logs in {db.parent}")
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
