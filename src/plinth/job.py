"""The job SDK: what a training script needs from Plinth, read from the environment it runs in.

    from plinth import job

    job.init()                                  # handle SIGTERM from the first step on
    state, start = job.load_checkpoint() or ({}, 0)
    for step in range(start, steps):
        ...
        if job.should_stop():                   # preempted or cancelled
            job.save_checkpoint(state, step)
            raise SystemExit(job.STOPPED_EXIT_CODE)
        if step % 100 == 0:
            job.save_checkpoint(state, step)

A preempted job is requeued and started again as a new attempt with the same checkpoint
directory, so `load_checkpoint` finds the state it saved. Outside Plinth (no
PLINTH_CHECKPOINT_DIR) the same script runs, without checkpoints.

Each save is reported to the platform through a marker file next to the checkpoint
(CHECKPOINT_MARKER: {"step": int, "attempt": int, "time": epoch seconds}), which the runtime
watches; the job needs no token and no network. A script that saves its checkpoints some other way
calls `report_checkpoint(step)` once the files are in place.

torch is imported only by the functions that save and load, and nothing else of Plinth is
imported, so this module is cheap to import in any job.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

CHECKPOINT_FILE = "checkpoint.pt"
# Replaced after every save; the runtime turns a new one into a CHECKPOINTED event.
CHECKPOINT_MARKER = ".plinth-checkpoint.json"
# What a script that stops on request exits with: the code of a death by SIGTERM, so that the
# stop is not mistaken for a finished job.
STOPPED_EXIT_CODE = 128 + signal.SIGTERM

_stop = threading.Event()
_installed = False
_warned = False


def init() -> None:
    """Install the SIGTERM handler behind `should_stop`. Call it from the main thread early:
    until it is installed, a SIGTERM ends the process at once."""
    global _installed
    if _installed:
        return
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("plinth.job.init: call it (or should_stop) first from the main thread; "
                          "Python installs signal handlers only there")
    signal.signal(signal.SIGTERM, _on_signal)
    _installed = True


def _on_signal(_sig: int, _frame: object) -> None:
    _stop.set()


def should_stop() -> bool:
    """True once Plinth has asked the job to stop (SIGTERM: preemption or cancel)."""
    init()
    return _stop.is_set()


def job_id() -> int | None:
    v = os.environ.get("PLINTH_JOB_ID")
    return int(v) if v else None


def attempt() -> int:
    """Which attempt of the job this is; it changes when a preempted job is started again."""
    return int(os.environ.get("PLINTH_ATTEMPT", "0"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def checkpoint_dir() -> Path | None:
    """PLINTH_CHECKPOINT_DIR, or None when the job has no checkpoint directory."""
    v = os.environ.get("PLINTH_CHECKPOINT_DIR")
    return Path(v) if v else None


def is_restart() -> bool:
    """True when an earlier attempt left a checkpoint: this run resumes rather than starts."""
    d = checkpoint_dir()
    return d is not None and (d / CHECKPOINT_FILE).exists()


def save_checkpoint(state: dict[str, Any], step: int, *, all_ranks: bool = False) -> bool:
    """Save `state` as the latest checkpoint, at `step`. True if a file was written.

    Written to a temporary file and renamed over the previous checkpoint, so a job killed while
    saving leaves the previous one whole. Only rank 0 writes unless `all_ranks` (each rank then
    writes its own file), since data-parallel ranks hold the same state. Rank 0 then reports the
    save to the platform (`report_checkpoint`); with `all_ranks` that report does not wait for
    the other ranks' files.
    """
    d = checkpoint_dir()
    if d is None:
        _warn_once("PLINTH_CHECKPOINT_DIR is not set: checkpoints are not saved")
        return False
    if rank() != 0 and not all_ranks:
        return False
    import torch

    d.mkdir(parents=True, exist_ok=True)
    path = d / _file(all_ranks)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save({"step": int(step), "attempt": attempt(), "state": state}, tmp)
    os.replace(tmp, path)
    report_checkpoint(int(step))
    return True


def report_checkpoint(step: int) -> bool:
    """Tell the platform that a checkpoint at `step` is in place. True if reported.

    `save_checkpoint` calls it; a script that writes its checkpoints itself calls it after they
    are complete. Only rank 0 reports, and only under Plinth (PLINTH_CHECKPOINT_DIR set). The
    marker is replaced atomically, so the runtime never reads half of one; it holds only the
    latest save, so saves closer together than the runtime looks are reported as the last.
    """
    d = checkpoint_dir()
    if d is None or rank() != 0:
        return False
    try:
        n = operator.index(step)  # an int, a numpy integer or a 0-d integer tensor
    except TypeError:
        n = -1
    if n < 0 or isinstance(step, bool):
        raise ValueError(f"plinth.job.report_checkpoint: step must be an integer >= 0, "
                         f"got {step!r}")
    d.mkdir(parents=True, exist_ok=True)
    marker = d / CHECKPOINT_MARKER
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"step": n, "attempt": attempt(), "time": time.time()}))
    os.replace(tmp, marker)
    return True


def load_checkpoint(*, all_ranks: bool = False,
                    map_location: Any = "cpu") -> tuple[dict[str, Any], int] | None:
    """(state, step) of the latest checkpoint, or None when there is none."""
    d = checkpoint_dir()
    if d is None or not (d / _file(all_ranks)).exists():
        return None
    import torch

    # The file is the job's own (written by save_checkpoint), and `state` may hold any
    # picklable object, so the full unpickler is used.
    data = torch.load(d / _file(all_ranks), map_location=map_location, weights_only=False)
    return data["state"], int(data["step"])


def _file(all_ranks: bool) -> str:
    return f"checkpoint-rank{rank()}.pt" if all_ranks else CHECKPOINT_FILE


def _warn_once(msg: str) -> None:
    global _warned
    if not _warned:
        print(f"plinth.job: {msg}", file=sys.stderr, flush=True)
        _warned = True
