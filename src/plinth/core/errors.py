"""Errors a user sees. Each one is a single line that names the file, line or field at fault."""


class PlinthError(Exception):
    """Base for errors that the CLI prints as one line, without a traceback."""


class SpecError(PlinthError):
    """A user-written spec (cluster YAML, job spec, option) is invalid."""


class Unavailable(PlinthError):
    """A runtime could not start a job now for a reason of the cluster's, not the job's: its
    node is not ready yet, or has just gone. The job is requeued, not failed."""


class TraceError(PlinthError):
    """A trace file is malformed. The message names the file and line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path, self.line = path, line


class UnplaceableError(PlinthError):
    """A job can never fit the cluster, even when it is empty."""
