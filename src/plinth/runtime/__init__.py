"""Runtimes carry out the scheduler's decisions, each implementing the protocol of
plinth.core.runtime (re-exported here): `local` runs jobs as processes on this machine (with
`gpu` for NVML and MPS, `limits` for CPU and memory limits, and `shim` as the process that wraps
each worker), `ray` on a Ray cluster, `sim` in virtual time."""

from plinth.core.runtime import (
    EventKind,
    Handle,
    LaunchSpec,
    ProcRef,
    Runtime,
    RuntimeEvent,
    WorkerLaunch,
)
from plinth.runtime.local import LocalRuntime

__all__ = ["EventKind", "Handle", "LaunchSpec", "LocalRuntime", "ProcRef", "Runtime",
           "RuntimeEvent", "WorkerLaunch"]
