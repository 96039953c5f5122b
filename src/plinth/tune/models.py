"""Small torch models to tune in tests, examples and benchmarks (no downloads)."""

from __future__ import annotations

from typing import Any


def tiny_linear() -> Any:
    """One Linear layer, 64 -> 64: a single tuning task, for end-to-end tests."""
    import torch

    return torch.nn.Linear(64, 64)


def small_cnn() -> Any:
    """Three 3x3 convolutions and a linear head, for 1x3x32x32 input: a CNN small enough to
    tune in minutes on two shared cores (a ResNet-18 at 224x224 has about 20 tasks and is not)."""
    import torch
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1, stride=2), nn.ReLU(),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    ).to(torch.float32)
