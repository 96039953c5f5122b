"""SLO-aware inference autoscaling after Faro (Jeon et al., EuroSys 2025).

Pure decision code: `latency` (queueing model), `utility` (relaxed utilities and objectives),
`predict` (probabilistic forecasts), `solver` (cluster-wide replica allocation), `policies` (Faro and
the baselines) and `controller` (the functional core of the control loop). Around it: `sim`
replays traces in virtual time; `router` and `replica` are the processes of a service's units,
and `workload` is the Service kind's controller. Importing this package loads neither torch nor the web stack; `router` and `replica` do.
"""

from plinth.serve.controller import Controller
from plinth.serve.policies import POLICIES, make_policy
from plinth.serve.solver import Solution, solve
from plinth.serve.types import Decision, Snapshot
from plinth.serve.utility import JobModel

__all__ = ["POLICIES", "Controller", "Decision", "JobModel", "Snapshot", "Solution",
           "make_policy", "solve"]
