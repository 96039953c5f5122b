"""A replica (or a router) started as a child process, for tests and benches that measure one
alone.

In the product each is a unit job that the scheduler places and the runtime starts
(`plinth.serve.workload`); this helper exists only to drive one directly."""

from __future__ import annotations

import queue
import subprocess
import sys
import tempfile
import threading
from typing import IO, Self

from plinth.core.errors import PlinthError


class ReplicaProcess:
    """A replica started as a child process, for tests, benches and local shells:
    `start` returns once it printed its ready line; `stop` sends SIGTERM and waits."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: IO[bytes]) -> None:
        self.proc, self.url, self._log = proc, url, log

    @classmethod
    def start(cls, args: list[str], *, env: dict[str, str] | None = None,
              cwd: str | None = None, timeout_s: float = 120.0,
              module: str = "plinth.serve.replica") -> ReplicaProcess:
        """`python -m MODULE ARGS` (`plinth.serve.router` for a router); one that exits first,
        or is not ready in `timeout_s`, is a PlinthError carrying its last line of stderr."""
        log = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by stop()
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd,
                                env=env, stdout=subprocess.PIPE, stderr=log)
        lines: queue.Queue[bytes] = queue.Queue()

        def pump() -> None:  # keep reading, so a model that prints never blocks on the pipe
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(b"")

        threading.Thread(target=pump, daemon=True).start()
        rp = cls(proc, "", log)
        try:
            line = lines.get(timeout=timeout_s).decode().strip()
        except queue.Empty:
            line = ""
        if not line.startswith("ready "):
            code = rp.stop(grace_s=5.0)
            tail = rp.stderr_tail()
            log.close()
            raise PlinthError(f"{module} did not start (exit {code}): {tail}")
        rp.url = line.split(" ", 1)[1]
        return rp

    def stderr_tail(self) -> str:
        self._log.seek(0)
        err = self._log.read().decode(errors="replace").strip().splitlines()
        return err[-1] if err else "no output"

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after `grace_s`; the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def close(self) -> None:
        self.stop()
        self._log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


