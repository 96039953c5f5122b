"""Decentralised aggregation by consensus ADMM over Kirkman triple groups (no central server)."""

from plinth.fl.admm.consensus import ADMMConfig, ADMMReport, Site, iteration_cap, run_admm
from plinth.fl.admm.kirkman import kirkman_triple_system, verify

__all__ = [
    "ADMMConfig",
    "ADMMReport",
    "Site",
    "iteration_cap",
    "kirkman_triple_system",
    "run_admm",
    "verify",
]
