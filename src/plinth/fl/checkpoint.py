"""Per-round checkpoints: SQLite metadata plus one .npy file per array.

Layout of a checkpoint folder::

    meta.sqlite            rounds(round, created, n_params, state_names, record)
    round_000007/          params_000.npy …, state_<name>_000.npy …

A round's arrays are written to a temporary folder, flushed, and renamed into place *before* its
row is committed, so the newest row always points at complete files. A server killed at any
moment resumes from the newest committed round. Older round folders are pruned (two are kept).

The checkpoint is the unit's own: its controller never reads it. What the controller needs (each
committed round, the tree's size) the checkpointer reports (`plinth.fl.reports`).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl.messages import NDArrays
from plinth.fl.reports import RoundReports

KEEP = 2


@dataclass(slots=True)
class Restored:
    round: int
    parameters: NDArrays
    state: dict[str, NDArrays]
    records: list[dict[str, Any]]


class Checkpointer:
    def __init__(self, folder: str | Path, reports: RoundReports | None = None) -> None:
        self.reports = reports or RoundReports(None, server=True)
        self.shape: dict[str, Any] | None = None  # the last round's tree, with one
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.dir / "meta.sqlite")
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS rounds (round INTEGER PRIMARY KEY, "
                        "created REAL, n_params INTEGER, state_names TEXT, record TEXT)")
        self.db.commit()

    def save(self, round: int, parameters: NDArrays, state: dict[str, NDArrays],
             record: dict[str, Any]) -> None:
        final = self.dir / f"round_{round:06d}"
        tmp = self.dir / f".round_{round:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files = [(f"params_{i:03d}.npy", a) for i, a in enumerate(parameters)]
        for name, arrays in state.items():
            files += [(f"state_{name}_{i:03d}.npy", a) for i, a in enumerate(arrays)]
        for fname, a in files:
            with open(tmp / fname, "wb") as f:
                np.save(f, np.asarray(a), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self.db.execute("INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?)",
                        (round, time.time(), len(parameters),
                         json.dumps({k: len(v) for k, v in state.items()}), json.dumps(record)))
        self.db.commit()
        for old in sorted(self.dir.glob("round_*"))[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
        self.reports.round(record)

    def tree(self, shape: dict[str, Any]) -> None:
        """The round's aggregator tree (`TreeAggregation.shape_doc`): its size is reported (the
        controller sizes the leaf units by it); the whole shape is kept as `shape`, and written
        to ``tree.json`` in the folder for an operator to read (atomically: never half of it)."""
        self.shape = shape
        tmp = self.dir / ".tree.json.tmp"
        tmp.write_text(json.dumps(shape, indent=1, sort_keys=True))
        tmp.replace(self.dir / "tree.json")
        self.reports.tree(int(shape["leaves"]))

    def latest(self) -> Restored | None:
        row = self.db.execute("SELECT round, n_params, state_names FROM rounds "
                              "ORDER BY round DESC LIMIT 1").fetchone()
        if row is None:
            return None
        rnd, n_params, names = row
        folder = self.dir / f"round_{rnd:06d}"
        try:
            params = [np.load(folder / f"params_{i:03d}.npy", allow_pickle=False)
                      for i in range(n_params)]
            state = {k: [np.load(folder / f"state_{k}_{i:03d}.npy", allow_pickle=False)
                         for i in range(n)] for k, n in json.loads(names).items()}
        except (OSError, ValueError) as e:
            raise PlinthError(f"{folder}: checkpoint of round {rnd} is unreadable ({e})") from None
        records = [json.loads(r) for (r,) in
                   self.db.execute("SELECT record FROM rounds WHERE round <= ? ORDER BY round",
                                   (rnd,))]
        self.reports.restored(records)
        return Restored(rnd, params, state, records)

    def close(self) -> None:
        self.db.close()
        self.reports.close()
