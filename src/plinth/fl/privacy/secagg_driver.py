"""Run a whole SecAgg+ round in one process: for tests, benchmarks and the simulator.

The driver is the "transport": it carries each client's message to the server and back, drops the
clients named in ``drop`` before a stage, and measures time and bytes per party. A federated task
wires the same ``ClientSecAgg`` / ``ServerSecAgg`` methods to its transport instead
(``secagg_round``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from plinth.fl.privacy.masking import dequantize
from plinth.fl.privacy.secagg import (
    ClientSecAgg,
    SecAggConfig,
    SecAggResult,
    ServerSecAgg,
)
from plinth.fl.privacy.secagg_messages import ROUND_STAGES, Stage, wire_size


@dataclass(slots=True)
class RoundStats:
    client_seconds: dict[int, float] = field(default_factory=dict)
    client_bytes_sent: dict[int, int] = field(default_factory=dict)
    client_bytes_received: dict[int, int] = field(default_factory=dict)
    server_seconds: float = 0.0


@dataclass(slots=True)
class RoundOutcome:
    result: SecAggResult
    mean: np.ndarray  # decoded sum / number of survivors
    total: np.ndarray  # decoded sum
    stats: RoundStats
    server: ServerSecAgg


def run_secagg_round(
    config: SecAggConfig,
    updates: Mapping[int, np.ndarray],
    *,
    drop: Mapping[str, set[int]] | None = None,
    random_bytes: Callable[[int], bytes] | None = None,
    tamper: Callable[[str, object], object] | None = None,
) -> RoundOutcome:
    """One full round. ``drop[stage]`` clients go silent from that stage on (see `Stage`).

    ``tamper(stage, message)`` may replace a client message before the server sees it (tests).
    Raises ``SecAggAbort`` when the server aborts.
    """
    drop = {k: set(v) for k, v in (drop or {}).items()}
    unknown = set(drop) - set(ROUND_STAGES)
    if unknown:
        raise ValueError(f"unknown drop stages {sorted(unknown)}; "
                         f"use {[str(s) for s in ROUND_STAGES]}")
    kw = {} if random_bytes is None else {"random_bytes": random_bytes}
    server = ServerSecAgg(config)
    stats = RoundStats()
    gone: set[int] = set()

    def timed_client(c: int, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        stats.client_seconds[c] = stats.client_seconds.get(c, 0.0) + time.perf_counter() - t0
        stats.client_bytes_sent[c] = stats.client_bytes_sent.get(c, 0) + wire_size(out)
        return out

    def deliver(stage: str, msg) -> None:
        if tamper is not None:
            msg = tamper(stage, msg)
        if msg is not None:
            t0 = time.perf_counter()
            server.receive(msg)
            stats.server_seconds += time.perf_counter() - t0

    def timed_server(fn):
        t0 = time.perf_counter()
        out = fn()
        stats.server_seconds += time.perf_counter() - t0
        for c, m in out.items() if isinstance(out, dict) else ():
            stats.client_bytes_received[c] = stats.client_bytes_received.get(c, 0) + wire_size(m)
        return out

    clients = {}
    for c in config.client_ids:
        t0 = time.perf_counter()
        clients[c] = ClientSecAgg(c, config, **kw)
        stats.client_seconds[c] = time.perf_counter() - t0
    gone |= drop.get(Stage.ADVERTISE, set())
    for c in config.client_ids:
        if c not in gone:
            deliver(Stage.ADVERTISE, timed_client(c, clients[c].advertise))
    dirs = timed_server(server.close_advertise)
    gone |= drop.get(Stage.SHARE_KEYS, set())
    for c, msg in dirs.items():
        if c not in gone:
            deliver(Stage.SHARE_KEYS, timed_client(c, clients[c].share_keys, msg))
    fwd = timed_server(server.close_share_keys)
    gone |= drop.get(Stage.MASKED_INPUT, set())
    for c, msg in fwd.items():
        if c not in gone:
            deliver(Stage.MASKED_INPUT, timed_client(c, clients[c].masked_input, msg, updates[c]))
    reqs = timed_server(server.close_masked_input)
    gone |= drop.get(Stage.UNMASK, set())
    for c, msg in reqs.items():
        if c not in gone:
            deliver(Stage.UNMASK, timed_client(c, clients[c].unmask, msg))
    result = timed_server(server.close_unmask)
    total = dequantize(result.total, scale=config.scale)
    return RoundOutcome(result, total / len(result.survivors), total, stats, server)
