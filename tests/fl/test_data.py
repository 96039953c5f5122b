import gzip
import json
import pickle
import struct

import numpy as np
import pytest

from plinth.core.errors import SpecError
from plinth.fl import data


def test_digits_loads_scaled_and_split():
    train, test = data.load_digits(np.random.default_rng(0))
    assert len(train) + len(test) == 1797 and train.x.dtype == np.float32
    assert 0 <= train.x.min() and train.x.max() <= 1


def test_mnist_unpickler_refuses_anything_but_arrays(tmp_path):
    evil = tmp_path / "mnist.pkl.gz"
    evil.write_bytes(gzip.compress(pickle.dumps(((np.zeros(2), print), 1, 2))))
    with pytest.raises(SpecError, match="refusing to load builtins.print"):
        data.load_mnist(evil)


def test_mnist_from_a_pickle_in_its_format(tmp_path):
    rng = np.random.default_rng(0)
    split = [(rng.random((n, 784), dtype=np.float32), rng.integers(0, 10, n)) for n in (5, 3, 4)]
    p = tmp_path / "m.pkl.gz"
    p.write_bytes(gzip.compress(pickle.dumps(tuple(split))))
    train, test = data.load_mnist(p)
    assert len(train) == 8 and len(test) == 4 and train.y.dtype == np.int64


def test_idx_files(tmp_path):
    imgs = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    (tmp_path / "i").write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">3I", 2, 3, 3) + imgs.tobytes())
    with gzip.open(tmp_path / "l.gz", "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + struct.pack(">I", 2) + bytes([7, 1]))
    ds = data.load_idx(tmp_path / "i", tmp_path / "l.gz")
    assert ds.x.shape == (2, 9) and ds.y.tolist() == [7, 1]
    np.testing.assert_allclose(ds.x[1, 0], 9 / 255)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(SpecError, match="bad magic"):
        data.load_idx(tmp_path / "bad", tmp_path / "l.gz")


def test_csv_and_missing_label_column(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b,label\n0.5,1,3\n0,0,1\n")
    ds = data.load_csv(p)
    assert ds.x.shape == (2, 2) and ds.y.tolist() == [3, 1]
    with pytest.raises(SpecError, match="no column 'y'"):
        data.load_csv(p, "y")


def test_leaf_json_and_natural_partition(tmp_path):
    doc = {"users": ["u1", "u2", "u3"], "num_samples": [2, 1, 3],
           "user_data": {u: {"x": [[0.1] * 4] * n, "y": [1] * n}
                         for u, n in zip(["u1", "u2", "u3"], [2, 1, 3])}}
    (tmp_path / "all_data_0.json").write_text(json.dumps(doc))
    ds = data.load_leaf(tmp_path)
    assert len(ds) == 6
    parts = data.partition(ds, 3, "natural", np.random.default_rng(0))
    assert sorted(len(p) for p in parts) == [1, 2, 3]
    with pytest.raises(SpecError, match="natural"):
        data.partition(data.Dataset(ds.x, ds.y), 3, "natural", np.random.default_rng(0))


def _is_partition(parts, n):
    allidx = np.concatenate(parts)
    return len(allidx) == n and len(np.unique(allidx)) == n


def test_partitioners_cover_every_example_once_and_are_seeded():
    y = np.random.default_rng(0).integers(0, 10, 2000)
    ds = data.Dataset(np.zeros((2000, 1), np.float32), y)
    for scheme in ("iid", "dirichlet", "shards"):
        a = data.partition(ds, 20, scheme, np.random.default_rng(5), alpha=0.3)
        b = data.partition(ds, 20, scheme, np.random.default_rng(5), alpha=0.3)
        assert _is_partition(a, 2000) and all(np.array_equal(x, z) for x, z in zip(a, b))


def test_dirichlet_skew_grows_as_alpha_shrinks():
    y = np.random.default_rng(0).integers(0, 10, 5000)
    ds = data.Dataset(np.zeros((5000, 1), np.float32), y)

    def labels_per_client(alpha):
        parts = data.partition(ds, 50, "dirichlet", np.random.default_rng(1), alpha=alpha)
        return np.mean([np.max(np.bincount(y[p], minlength=10)) / len(p) for p in parts])

    assert labels_per_client(0.1) > labels_per_client(1.0) > labels_per_client(100.0)


def test_shards_give_few_labels_per_client():
    y = np.repeat(np.arange(10), 100)
    parts = data.partition(data.Dataset(np.zeros((1000, 1)), y), 10, "shards",
                           np.random.default_rng(0), shards_per_client=2)
    assert max(len(np.unique(y[p])) for p in parts) <= 2
