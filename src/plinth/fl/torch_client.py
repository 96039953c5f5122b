"""PyTorch glue: model ⇄ arrays, and the built-in classifier client used by the examples."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from plinth.fl.data import Dataset
from plinth.fl.messages import Config, Metrics, NDArrays


def get_parameters(model: nn.Module) -> NDArrays:
    """Every entry of the state dict (weights and buffers), as numpy copies."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def set_parameters(model: nn.Module, arrays: NDArrays) -> None:
    keys = list(model.state_dict().keys())
    if len(keys) != len(arrays):
        raise ValueError(f"{len(arrays)} arrays for a model with {len(keys)} tensors")
    state = {k: torch.from_numpy(np.array(a, copy=True)) for k, a in zip(keys, arrays)}
    model.load_state_dict(state, strict=True)


@torch.no_grad()
def evaluate_model(model: nn.Module, ds: Dataset, batch_size: int = 1000) -> tuple[float, float]:
    """Mean cross-entropy and accuracy on `ds`."""
    model.eval()
    loss, correct = 0.0, 0
    for s in range(0, len(ds), batch_size):
        x = torch.from_numpy(ds.x[s:s + batch_size])
        y = torch.from_numpy(ds.y[s:s + batch_size])
        out = model(x)
        loss += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(1) == y).sum())
    n = max(1, len(ds))
    return loss / n, correct / n


class TorchClassifierClient:
    """Trains a classifier with SGD on its local data. Honours FedProx's `proximal_mu`."""

    def __init__(self, model: nn.Module, train: Dataset, test: Dataset | None = None, *,
                 epochs: int = 1, batch_size: int = 32, lr: float = 0.05, momentum: float = 0.0,
                 seed: int = 0) -> None:
        self.model, self.train, self.test = model, train, test
        self.epochs, self.batch_size, self.lr, self.momentum = epochs, batch_size, lr, momentum
        self.seed = seed

    def fit(self, parameters: NDArrays, config: Config) -> tuple[NDArrays, int, Metrics]:
        set_parameters(self.model, parameters)
        mu = float(config.get("proximal_mu", 0.0))
        anchor = [p.detach().clone() for p in self.model.parameters()] if mu > 0 else []
        opt = torch.optim.SGD(self.model.parameters(), lr=float(config.get("lr", self.lr)),
                              momentum=self.momentum)
        g = torch.Generator().manual_seed(self.seed * 100_003 + int(config.get("round", 0)))
        x_all, y_all = torch.from_numpy(self.train.x), torch.from_numpy(self.train.y)
        n = len(self.train)
        self.model.train()
        total, steps = 0.0, 0
        for _ in range(int(config.get("epochs", self.epochs))):
            order = torch.randperm(n, generator=g)
            for s in range(0, n, self.batch_size):
                idx = order[s:s + self.batch_size]
                opt.zero_grad()
                loss = nn.functional.cross_entropy(self.model(x_all[idx]), y_all[idx])
                if mu > 0:
                    loss = loss + 0.5 * mu * sum(((p - a) ** 2).sum()
                                                 for p, a in zip(self.model.parameters(), anchor))
                loss.backward()
                opt.step()
                total += float(loss.detach())
                steps += 1
        return get_parameters(self.model), n, {"train_loss": total / max(1, steps)}

    def evaluate(self, parameters: NDArrays, config: Config) -> tuple[float, int, Metrics]:
        set_parameters(self.model, parameters)
        ds = self.test if self.test is not None else self.train
        loss, acc = evaluate_model(self.model, ds)
        return loss, len(ds), {"accuracy": acc}


def make_default_client(model: nn.Module, train: Dataset, test: Dataset | None, train_spec: Any,
                        seed: int) -> TorchClassifierClient:
    return TorchClassifierClient(model, train, test, epochs=train_spec.epochs,
                                 batch_size=train_spec.batch_size, lr=train_spec.lr,
                                 momentum=train_spec.momentum, seed=seed)
