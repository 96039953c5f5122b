"""Device placement of model graphs after Baechi (Jeon et al., SoCC'20).

Profile a model's operator graph, coarsen it, place it on memory-limited devices with m-TOPO,
m-ETF or m-SCT, predict the step time with a simulator, and `apply` the plan to the model.
Depends only on `plinth.core`.
"""

from plinth.place.algorithms import PLACERS, Devices, Placement, m_etf, m_sct, m_topo, placer
from plinth.place.apply import apply
from plinth.place.coarsen import Coarse, coarsen
from plinth.place.comm import PCIE, CommModel, fit, measure_local
from plinth.place.graph import OpGraph
from plinth.place.plan import Plan, parse_size, place_model, plan_graph
from plinth.place.profile import Profiled, profile
from plinth.place.simulate import StepReport, critical_path_us, simulate, single_device

__all__ = [
    "PCIE", "PLACERS", "Coarse", "CommModel", "Devices", "OpGraph", "Placement", "Plan",
    "Profiled", "StepReport", "apply", "coarsen", "critical_path_us", "fit", "m_etf", "m_sct",
    "m_topo", "measure_local", "parse_size", "place_model", "placer", "plan_graph", "profile", "simulate",
    "single_device",
]
