"""The model of the MNIST example: a small CNN (two 5×5 conv layers, as in McMahan et al.).

Inputs arrive flat (784 features for MNIST, 64 for the digits fallback); the first layer
reshapes them to a square image.
"""

import math

from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, features: int, classes: int = 10) -> None:
        super().__init__()
        self.side = math.isqrt(features)
        side = self.side // 4
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * side * side, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x):
        return self.net(x.view(-1, 1, self.side, self.side))


def make_model(spec):
    """Called by Plinth with the app spec; MNIST falls back to digits when it is not installed."""
    from plinth.fl.data import mnist_path

    mnist = spec.data.source == "mnist" and (spec.data.path or mnist_path())
    return SmallCNN(784 if mnist else 64)
