"""The kinds the control plane runs, registered from the top.

Each kind is a spec model (read by the one loader, `plinth.core.spec.load_spec`) and, but for
`Job`, a controller (`plinth.core.kinds.Controller`) that lives with its kind's code and depends
on `core` only. They are registered here, the one place that names them all, as lazy targets
(the house registry style: a kind's heavy modules are imported when it is first used). Anything
that loads a spec of an unnamed kind imports this module first (the CLI, the Python client and
the API do).
"""

from __future__ import annotations

from pydantic import BaseModel

from plinth.core.errors import SpecError
from plinth.core.jobspec import JobSpec
from plinth.core.kinds import BaseController
from plinth.core.registry import Registry
from plinth.core.spec import KINDS, ClusterSpec

KINDS.add("Job", JobSpec)
KINDS.add("Service", "plinth.serve.spec:ServiceSpec")
KINDS.add("FLTask", "plinth.fl.app:AppSpec")
KINDS.add("Tune", "plinth.tune.spec:TuneSpec")
KINDS.add("Cluster", ClusterSpec)

CONTROLLERS: Registry[type[BaseController]] = Registry("workload kind")
CONTROLLERS.add("Service", "plinth.serve.workload:ServiceController")
CONTROLLERS.add("FLTask", "plinth.fl.workload:FLTaskController")
CONTROLLERS.add("Tune", "plinth.tune.controller:TuneController")


def check_kind(spec: object) -> str:
    """The kind of a spec the control plane runs; a kind it does not run yet is a one-line
    error naming the command that runs it."""
    kind = getattr(spec, "kind", "Job")
    if kind != "Job" and kind not in CONTROLLERS.names():
        run_with = getattr(spec, "run_with", "its own command")
        raise SpecError(f"kind: the control plane does not run {kind} specs yet; use "
                        f"`{run_with}` meanwhile")
    return kind


def job_to_run(spec: BaseModel, source: str = "spec") -> JobSpec:
    """The Job spec that the control plane runs. A spec of another kind (loaded by
    `plinth.core.spec.load_spec`) is a one-line error naming its kind and what runs it."""
    if isinstance(spec, JobSpec):
        return spec
    try:
        kind = check_kind(spec)
    except SpecError as e:
        raise SpecError(f"{source}: {e}") from None
    raise SpecError(f"{source}: kind: a {kind} spec is not a Job; submit it with "  # a workload
                    "`plinth submit FILE` (Client.submit_workload)")
