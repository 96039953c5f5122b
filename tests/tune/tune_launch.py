"""A launcher for tests: each unit a process in its own session, its output in a log file."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from plinth.control.kinds import Unit


class Launcher:
    """Starts units as `subprocess.Popen`; `cpus` pins units (by name) to CPU sets, as the
    runtime's CPU limits would."""

    def __init__(self, logs: Path, cpus: dict[str, set[int]] | None = None) -> None:
        self.logs, self.cpus, self.procs = logs, cpus or {}, {}
        logs.mkdir(parents=True, exist_ok=True)

    def __call__(self, unit: Unit) -> Group:
        cmd = list(unit.spec.command)
        if unit.name in self.cpus:
            cmd += ["--cpus", ",".join(map(str, sorted(self.cpus[unit.name])))]
        with open(self.logs / f"{unit.name}.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env={**os.environ, **unit.spec.env})
        self.procs[unit.name] = group = Group(proc)
        return group


class Group:
    """A unit's process group: terminate and kill reach the TVM workers it started too."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def poll(self) -> int | None:
        return self.proc.poll()

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL or self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
