"""A model whose forward pass takes a service time drawn from a fit (a lognormal from the
Faro traces), for replaying a trace against the real serving path: the router, the replicas'
processes, the scheduler and the autoscaler are the platform's own; only the model's compute is
stood in for by a sleep, so that a 2-core machine can host the replicas a 16-CPU cluster would.

    model: bench.serve_emulated:make   (env SERVE_EMU_FIT=fit.yaml, SERVE_EMU_COMPRESS=5)

Seeded per process: this is simulation, not a secret."""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import yaml
from scipy import stats


class Emulated(torch.nn.Module):
    def __init__(self, fit: dict, compress: float) -> None:
        super().__init__()
        p = fit["params"]
        self.dist = stats.lognorm(p["shape"], loc=p["loc"], scale=p["scale"])
        self.compress = compress
        self.rng = np.random.default_rng(os.getpid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(x.shape[0]):  # one service time per request
            time.sleep(float(self.dist.rvs(random_state=self.rng)) / self.compress)
        return torch.zeros((x.shape[0], 1))


def make() -> torch.nn.Module:
    path = os.environ.get("SERVE_EMU_FIT")
    if not path:
        raise ValueError("SERVE_EMU_FIT: give the service-time fit (YAML)")
    with open(path) as f:
        fit = yaml.safe_load(f)
    return Emulated(fit, float(os.environ.get("SERVE_EMU_COMPRESS", "1")))
