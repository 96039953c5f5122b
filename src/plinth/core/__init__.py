"""The resource model. Depends on nothing else in Plinth."""

from plinth.core.errors import PlinthError, SpecError, TraceError
from plinth.core.gpus import GPU_CATALOG, GpuModel, gpu_model
from plinth.core.resources import Allocation, Cluster, Node, Request, WorkerSlot
from plinth.core.workload import Job

__all__ = [
    "GPU_CATALOG",
    "Allocation",
    "Cluster",
    "GpuModel",
    "Job",
    "Node",
    "PlinthError",
    "Request",
    "SpecError",
    "TraceError",
    "WorkerSlot",
    "gpu_model",
]
