"""The three Baechi placers, by name. Each is a pure function (graph, devices, comm) -> Placement."""

from __future__ import annotations

from collections.abc import Callable

from plinth.core.registry import Registry
from plinth.place.algorithms.common import Devices, Placement
from plinth.place.algorithms.m_etf import m_etf
from plinth.place.algorithms.m_sct import m_sct
from plinth.place.algorithms.m_topo import m_topo
from plinth.place.comm import CommModel
from plinth.place.graph import OpGraph

Placer = Callable[[OpGraph, Devices, CommModel], Placement]

PLACERS: Registry[Placer] = Registry("algorithm", field="--algo")
PLACERS.add("m-topo", m_topo)
PLACERS.add("m-etf", m_etf)
PLACERS.add("m-sct", m_sct)


def placer(name: str) -> Placer:
    return PLACERS.get(name)


__all__ = ["PLACERS", "Devices", "Placement", "m_etf", "m_sct", "m_topo", "placer"]

