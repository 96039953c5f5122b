"""The three Baechi placers, by name. Each is a pure function (graph, devices, comm) -> Placement."""

from __future__ import annotations

from collections.abc import Callable

from plinth.core.errors import SpecError
from plinth.place.algorithms.common import Devices, Placement
from plinth.place.algorithms.m_etf import m_etf
from plinth.place.algorithms.m_sct import m_sct
from plinth.place.algorithms.m_topo import m_topo
from plinth.place.comm import CommModel
from plinth.place.graph import OpGraph

Placer = Callable[[OpGraph, Devices, CommModel], Placement]

PLACERS: dict[str, Placer] = {"m-topo": m_topo, "m-etf": m_etf, "m-sct": m_sct}


def placer(name: str) -> Placer:
    try:
        return PLACERS[name.lower()]
    except KeyError:
        raise SpecError(f"--algo: unknown algorithm {name!r}; choose one of: "
                        f"{', '.join(PLACERS)}") from None


__all__ = ["PLACERS", "Devices", "Placement", "m_etf", "m_sct", "m_topo", "placer"]

