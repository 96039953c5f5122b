"""A model factory small enough to place in a test (used by test_placement_job.py)."""

import torch
from torch import nn


def mlp(batch: int = 8):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return model, (torch.randn(batch, 64),)
