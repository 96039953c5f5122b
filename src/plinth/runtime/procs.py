"""A process as the runtimes know it across restarts: its identity (pid plus the kernel's start
ticks, so that a reused pid is never taken for it), its exit file, and signals to its group."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from plinth.runtime.base import ProcRef

START_TIME_TOLERANCE_S = 0.001  # a handle stored without start ticks: its create time


def same_process(ref: ProcRef) -> psutil.Process | None:
    """The process `ref` names, if its pid still belongs to it (not reused by another)."""
    try:
        p = psutil.Process(ref.pid)
        same = start_ticks(ref.pid) == ref.start_ticks if ref.start_ticks else \
            abs(p.create_time() - ref.start_time) <= START_TIME_TOLERANCE_S
    except psutil.NoSuchProcess:
        return None
    return p if same else None


def killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def read_exit(path: str, default: int | None = None) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return default


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of `pid` in clock ticks since boot (/proc/PID/stat, field 22),
    or None if it is gone. The command name (field 2) may hold spaces and parentheses, so the
    fields are counted after its closing one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])
