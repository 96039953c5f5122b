"""What the local and the Ray runtime share: the checks of a launch before anything starts, the
queue of events their watcher threads fill, and reading an attempt's checkpoint marker (the
file `plinth.job.save_checkpoint` replaces).

An attempt here is any object with `job_id`, `attempt`, `checkpoint_dir`, `launched_at`,
`marker_seen` and `marker_last`; each runtime keeps its own attempt record."""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plinth.core.errors import PlinthError
from plinth.core.resources import MILLI
from plinth.job import CHECKPOINT_MARKER
from plinth.core.runtime import EventKind, LaunchSpec, RuntimeEvent
from plinth.runtime.procs import read_small

log = logging.getLogger(__name__)

MARKER_MAX_BYTES = 4096


def check_launch(spec: LaunchSpec, *, closed: bool, gpus_on: Mapping[str, int],
                 node_is: str) -> None:
    """Refuse a launch the runtime cannot carry out as given, in one line naming the field.
    `gpus_on` is each node's GPU count; `node_is` says what a node must be ("a node here")."""
    where = f"job {spec.job_id} attempt {spec.attempt}"
    if closed:
        raise PlinthError(f"{where}: the runtime is closed")
    if not spec.command:
        raise PlinthError(f"{where}: command is empty")
    if not spec.workers:
        raise PlinthError(f"{where}: workers is empty")
    for k, v in spec.env.items():  # as execve would refuse them, but before anything starts
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise PlinthError(f"{where}: env: illegal environment variable {k!r}"[:300])
    ranks = sorted(w.rank for w in spec.workers)
    if ranks != list(range(len(ranks))):
        raise PlinthError(f"{where}: workers: ranks must be 0..{len(ranks) - 1}, got {ranks}")
    for w in spec.workers:
        at = f"{where}: workers[{w.rank}]"
        n = gpus_on.get(w.node)
        if n is None:
            names = ", ".join(map(repr, gpus_on))
            raise PlinthError(f"{at}.node: {w.node!r} is not {node_is} ({names})")
        bad = [g for g in w.gpus if not 0 <= g < n]
        if bad:
            raise PlinthError(f"{at}.gpus: no GPU {bad[0]} on {w.node} ({n} GPUs)")
        if w.gpus and not 0 < w.gpu_milli <= MILLI:  # a CPU-only worker has no share
            raise PlinthError(f"{at}.gpu_milli: must be in 1..1000, got {w.gpu_milli}")
        if w.gpus and w.gpu_milli < MILLI and len(w.gpus) != 1:
            raise PlinthError(f"{at}.gpus: a fractional share (gpu_milli={w.gpu_milli}) "
                              f"needs exactly one GPU, got {list(w.gpus)}")


class EventQueue:
    """Events a watcher thread found, taken by `poll`; `notify` wakes the control loop."""

    def __init__(self, notify: Callable[[], None] | None = None) -> None:
        self._notify = notify
        self._events: list[RuntimeEvent] = []
        self._lock = threading.Lock()

    def poll(self) -> list[RuntimeEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def _emit(self, events: list[RuntimeEvent]) -> None:
        if not events:
            return
        with self._lock:
            self._events.extend(events)
        if self._notify is not None:
            self._notify()


def checkpoint_events(atts: Sequence[Any], problem: Callable[[str], None], *,
                      final: bool = False) -> list[RuntimeEvent]:
    """New markers of `atts`. `final`: the attempts have ended, so each marker is read even
    if it looks unchanged: a last save could hide behind a reused inode and a coarse mtime."""
    events = []
    for att in atts:
        if not att.checkpoint_dir:
            continue
        if final:
            att.marker_seen = None
        try:
            ev = checkpoint_event(att, problem)
        except Exception as e:  # an attempt that just ended must still get its end event
            log.exception("runtime: checkpoint marker")
            problem(f"job {att.job_id} attempt {att.attempt}: checkpoint marker: {e!r}")
            continue
        if ev is not None:
            events.append(ev)
    return events


def checkpoint_event(att: Any, problem: Callable[[str], None]) -> RuntimeEvent | None:
    """A CHECKPOINTED event if the attempt's marker is new and its own, else None."""
    path = os.path.join(att.checkpoint_dir, CHECKPOINT_MARKER)
    where = f"job {att.job_id} attempt {att.attempt}: checkpoint marker {path}"
    try:
        st = os.lstat(path)  # the job's own folder: a link it planted is not followed
    except FileNotFoundError:
        return None
    except OSError as e:
        problem(f"{where}: cannot stat: {e.strerror}")
        return None
    seen = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
    if seen == att.marker_seen:
        return None
    att.marker_seen = seen
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the watcher of every job
        problem(f"{where}: not a regular file; ignored")
        return None
    if st.st_size > MARKER_MAX_BYTES:
        problem(f"{where}: {st.st_size} bytes, more than a marker's {MARKER_MAX_BYTES}; ignored")
        return None
    raw = read_small(path, MARKER_MAX_BYTES)
    if raw is None:  # replaced since the lstat (by something else, maybe): the next tick looks
        att.marker_seen = None
        return None
    try:
        step, attempt, at = parse_marker(raw)
    except ValueError as e:
        problem(f"{where}: {e}; ignored")
        return None
    if attempt != att.attempt or at < att.launched_at:
        return None  # left by an earlier attempt: not news
    if (step, at) == att.marker_last:
        return None  # the same save, seen again (the file was touched or copied)
    att.marker_last = (step, at)
    return RuntimeEvent(att.job_id, att.attempt, EventKind.CHECKPOINTED,
                        message=f"checkpoint at step {step}", step=step, at=at)


def parse_marker(raw: bytes) -> tuple[int, int, float]:
    """(step, attempt, time) of a checkpoint marker; ValueError saying what is wrong."""
    try:
        d = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("not JSON") from None
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object, got {type(d).__name__}")
    step, attempt, at = d.get("step"), d.get("attempt"), d.get("time")
    for name, v, types, what in (("step", step, (int,), "an integer"),
                                 ("attempt", attempt, (int,), "an integer"),
                                 ("time", at, (int, float), "a number")):
        if not isinstance(v, types) or isinstance(v, bool):
            raise ValueError(f"{name}: expected {what}, got {v!r}"[:200])
    if step < 0 or attempt < 0:
        raise ValueError(f"step and attempt must not be negative, got {step} and {attempt}")
    if not math.isfinite(at):
        raise ValueError(f"time: expected a finite number, got {at!r}")
    return step, attempt, float(at)
