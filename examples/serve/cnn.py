"""Two small CNNs to serve as a user's own model (`model: examples.serve.cnn:make`).

- `make()`: LeNet-5 for 1x28x28 images (MNIST, Fashion-MNIST), 10 classes.
- `make_resnet()`: a ResNet-8 for 3x32x32 images (CIFAR-10), 10 classes.

A factory takes no arguments and returns an `nn.Module`. The weights are seeded so that every
replica answers the same; a real factory would load trained weights here instead.
"""

from __future__ import annotations

import torch
from torch import nn


class LeNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Block(nn.Module):
    """Two 3x3 convolutions with a shortcut (a 1x1 convolution where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = (nn.Identity() if stride == 1 and cin == cout else
                      nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                    nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


class ResNet8(nn.Module):
    def __init__(self, classes: int = 10, width: int = 16) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w),
                                  nn.ReLU())
        self.stages = nn.Sequential(Block(w, w, 1), Block(w, 2 * w, 2), Block(2 * w, 4 * w, 2))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def make() -> nn.Module:
    """LeNet-5, input shape 1,28,28."""
    torch.manual_seed(0)
    return LeNet().eval()


def make_resnet() -> nn.Module:
    """ResNet-8, input shape 3,32,32."""
    torch.manual_seed(0)
    return ResNet8().eval()
