"""A process as the runtimes know it across restarts: its identity (pid plus the kernel's start
ticks, so that a reused pid is never taken for it), its exit file, and signals to its group."""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

from plinth.runtime import shim
from plinth.core.runtime import ProcRef

SHIM = str(Path(shim.__file__).resolve())
EXIT_MAX_BYTES = 64
LOG_LIMIT_MIB = 256  # a job's log stops growing here (plinth up --log-limit)

START_TIME_TOLERANCE_S = 0.001  # a handle stored without start ticks: its create time


def same_process(ref: ProcRef) -> psutil.Process | None:
    """The process `ref` names, if its pid still belongs to it (not reused by another)."""
    if ref.pid <= 0:  # a worker known only by the exit file it left
        return None
    try:
        p = psutil.Process(ref.pid)
        same = start_ticks(ref.pid) == ref.start_ticks if ref.start_ticks else \
            abs(p.create_time() - ref.start_time) <= START_TIME_TOLERANCE_S
    except psutil.NoSuchProcess:
        return None
    return p if same else None


def user_ids(name: str) -> list:
    """[uid, gid, groups] of a Unix user, as the shim drops to them; a root user is refused."""
    p = pwd.getpwnam(name)  # KeyError: no such user
    if p.pw_uid == 0:
        raise PermissionError(f"run_as: {name!r} is uid 0; no job runs as root")
    return [p.pw_uid, p.pw_gid, os.getgrouplist(name, p.pw_gid)]


def start_shim(exit_file: str, *, command: Sequence[str], env: Mapping[str, str],
               workdir: str | None, log_path: str, opts: Sequence[str] = (),
               run_as: str | None = None, shim_env: Mapping[str, str] | None = None
               ) -> subprocess.Popen:
    """Start one worker: the shim, in a session of its own, appending to `log_path`. The
    command, its environment, its folder and its user go to the shim on stdin, never into the
    shim's own argv or environment (see plinth.runtime.shim): `shim_env` holds only what the
    platform itself sets. The shim starts with SIGTERM and SIGINT blocked (a mask survives fork
    and exec) and unblocks them once its handler is in place: a stop that comes while Python is
    still starting up then waits for the handler instead of killing the shim before it can
    write an exit code."""
    launch = {"argv": list(command), "env": dict(env), "cwd": workdir,
              "user": user_ids(run_as) if run_as is not None else None}
    argv = [sys.executable, "-I", SHIM, *opts, exit_file]
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, shim.RELAYED)
    try:
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out,
                                     stderr=subprocess.STDOUT, env=dict(shim_env or {}),
                                     cwd="/", start_new_session=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        with popen.stdin:  # type: ignore[union-attr]
            popen.stdin.write(json.dumps(launch).encode())  # type: ignore[union-attr]
    except BrokenPipeError:
        pass  # the shim died before it read its launch: it leaves no exit code, seen as lost
    return popen


def find_shim(exit_file: str) -> ProcRef | None:
    """A running shim of this runtime's user that writes `exit_file`: a worker forked by a
    control plane that died before it could record it. A process of another user that merely
    names the file in its argv is not taken for it."""
    for p in psutil.process_iter(["cmdline", "uids"]):
        cmd, uids = p.info["cmdline"] or [], p.info["uids"]
        if len(cmd) > 3 and cmd[-1] == exit_file and cmd[2] == SHIM and uids is not None \
                and uids.real == os.geteuid():
            ticks = start_ticks(p.pid)
            if ticks is not None:
                try:
                    return ProcRef(p.pid, p.create_time(), exit_file, ticks)
                except psutil.NoSuchProcess:
                    pass
    return None


def killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def read_small(path: str, limit: int) -> bytes | None:
    """The content of a regular file of at most `limit` bytes, or None: a FIFO, a device, a
    link or anything larger is never opened for reading in a way that could block or run long
    (O_NONBLOCK, O_NOFOLLOW, then checked by fstat), so a file a job left cannot stall a
    runtime's watcher."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        return os.read(fd, limit + 1)[:limit]
    except OSError:
        return None
    finally:
        os.close(fd)


def read_exit(path: str, default: int | None = None) -> int | None:
    raw = read_small(path, EXIT_MAX_BYTES)
    try:
        return int(raw.strip()) if raw is not None else default
    except ValueError:
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


def start_error(log_path: str) -> str:
    """The line a shim wrote on why its command could not start (exit 126 or 127), from the
    end of the job's log (a file in the server's own folder); "" if there is none."""
    try:
        fd = os.open(log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, 4096, max(0, size - 4096)).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
    lines = [ln for ln in tail.splitlines() if ln.startswith("plinth shim: ")]
    return lines[-1].removeprefix("plinth shim: ") if lines else ""


def exit_time(exit_files: Iterable[str]) -> float | None:
    """When the last of some workers ended, from their exit files' mtimes; None if none left
    one."""
    times = []
    for path in exit_files:
        try:
            times.append(os.stat(path).st_mtime)
        except OSError:
            pass
    return max(times) if times else None


def user_env(run_as: str | None) -> dict[str, str]:
    """USER, LOGNAME and HOME of the user a job runs as (a spec's own HOME wins: it is applied
    after); none for a job of the runtime's own user."""
    if run_as is None:
        return {}
    p = pwd.getpwnam(run_as)
    return {"USER": p.pw_name, "LOGNAME": p.pw_name, "HOME": p.pw_dir}
