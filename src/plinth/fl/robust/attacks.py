"""Simulated client attacks for robustness experiments. Pure functions; randomness is passed in."""

from __future__ import annotations

import numpy as np


def choose_attackers(n_clients: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of round(fraction * n) attacking clients."""
    if not 0 <= fraction < 1:
        raise ValueError(f"attacker fraction must be in [0, 1), got {fraction}")
    return np.sort(rng.choice(n_clients, round(fraction * n_clients), replace=False))


def sign_flip(update: np.ndarray, *, scale: float = 1.0) -> np.ndarray:
    """Send -scale * the honest update."""
    return -scale * np.asarray(update, dtype=np.float64)


def scaled_update(update: np.ndarray, *, boost: float) -> np.ndarray:
    """Model replacement (Bagdasaryan et al. 2020): boost the update so it survives averaging.

    With n clients under FedAvg a boost of about n replaces the global model by the attacker's.
    """
    return boost * np.asarray(update, dtype=np.float64)


def gaussian_noise_update(
    update: np.ndarray, *, std: float, rng: np.random.Generator
) -> np.ndarray:
    """Replace the update by pure Gaussian noise of the given std."""
    return rng.normal(0.0, std, np.shape(update))


def label_flip(
    labels: np.ndarray, *, num_classes: int, mapping: dict[int, int] | None = None
) -> np.ndarray:
    """Relabel the attacker's data: by ``mapping`` or, by default, y -> num_classes - 1 - y."""
    y = np.asarray(labels)
    if mapping is None:
        return num_classes - 1 - y
    out = y.copy()
    for a, b in mapping.items():
        out[y == a] = b
    return out


def add_trigger(x: np.ndarray, *, side: int, patch: int = 3, value: float = 1.0) -> np.ndarray:
    """Stamp a ``patch`` x ``patch`` square in the bottom-right corner of flattened side x side images."""
    out = np.array(x, dtype=np.float64, copy=True).reshape(-1, side, side)
    out[:, side - patch :, side - patch :] = value
    return out.reshape(np.shape(x))


def backdoor(
    x: np.ndarray,
    y: np.ndarray,
    *,
    side: int,
    target: int,
    fraction: float,
    rng: np.random.Generator,
    patch: int = 3,
    value: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Poison ``fraction`` of (x, y): stamp the trigger and relabel to ``target``."""
    x2, y2 = np.array(x, dtype=np.float64, copy=True), np.array(y, copy=True)
    idx = rng.choice(len(y2), round(fraction * len(y2)), replace=False)
    x2[idx] = add_trigger(x2[idx], side=side, patch=patch, value=value)
    y2[idx] = target
    return x2, y2


def backdoor_success_rate(
    predict,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    side: int,
    target: int,
    patch: int = 3,
    value: float = 1.0,
) -> float:
    """Fraction of triggered test inputs (true label != target) classified as ``target``."""
    keep = y_test != target
    xt = add_trigger(x_test[keep], side=side, patch=patch, value=value)
    return float(np.mean(predict(xt) == target))
