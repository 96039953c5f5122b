"""Runtimes carry out the scheduler's decisions: `base` is the protocol, `local` runs jobs as
processes on this machine (with `gpu` for NVML and MPS, `limits` for CPU and memory limits, and
`shim` as the process that wraps each worker)."""

from plinth.runtime.base import (
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
