"""A batch of launches, carried out as the runtime allows: the local runtime's are forks, made
one after another; a runtime that says "concurrent-launch" (Ray reserves a placement group and
starts an actor per worker, seconds each) gets up to `threads` at once, so the caller waits for
the slowest rather than their sum."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from plinth.core.errors import PlinthError
from plinth.runtime.base import Handle, LaunchSpec, Runtime

log = logging.getLogger("plinth.control")


def launch_error(job_id: int, e: Exception) -> str:
    """One line on why a job's launch failed; an error that is not the platform's own (a bug,
    not bad input) is logged with its traceback."""
    if not isinstance(e, PlinthError):
        log.error("job %d: launch failed", job_id, exc_info=e)
        return f"{type(e).__name__}: {e}"
    return str(e)


class Launcher:
    def __init__(self, runtime: Runtime, threads: int = 8) -> None:
        self.runtime, self.threads = runtime, threads
        self._pool: ThreadPoolExecutor | None = None  # made at the first concurrent batch

    def launch(self, specs: list[LaunchSpec]) -> list[Handle | str]:
        """Each spec's handle, or why its launch failed: a failure is that job's alone."""
        if len(specs) > 1 and "concurrent-launch" in self.runtime.capabilities:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="plinth-launch")
            return list(self._pool.map(self._one, specs))
        return [self._one(s) for s in specs]

    def _one(self, spec: LaunchSpec) -> Handle | str:
        try:
            return self.runtime.launch(spec)
        except Exception as e:  # noqa: BLE001 -- this job's alone: it becomes launch-failed
            return launch_error(spec.job_id, e)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
