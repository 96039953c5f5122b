"""The tuning database: MetaSchedule JSON databases keyed by (model, target, share), by folder.

    DB/<model key>/<target>/share-<s>/shard-<i>of<k>/database_{workload,tuning_record}.json
                                                     meta.json

Each tuning client writes its own JSONDatabase (a JSONDatabase numbers workloads per file, so
two writers of one file would corrupt it), and a record lands as soon as it is measured: a
client or server that dies loses only its in-flight trials. Within a folder MetaSchedule keys
records by task (the workload's structural hash). `meta.json` is written when a shard ends.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plinth.tune.plan import share_key

META = "meta.json"
RECORDS = "database_tuning_record.json"
WORKLOADS = "database_workload.json"


def model_key(model: str, input_shape: list[int] | tuple[int, ...]) -> str:
    """A folder name for a model at an input shape: `plinth.tune.models-small_cnn-1x3x32x32`."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(model).stem if model.endswith(".pt2")
                  else model).strip("-")
    return f"{base}-{'x'.join(str(d) for d in input_shape)}"


def shard_dir(db: str | Path, model: str, input_shape: list[int] | tuple[int, ...],
              target: str, share: float, index: int, count: int) -> Path:
    return (Path(db) / model_key(model, input_shape) / target / share_key(share)
            / f"shard-{index}of{count}")


@dataclass(frozen=True, slots=True)
class TunedRecords:
    """The records tuned at one share: its shard folders, opened as one MetaSchedule database."""

    share: float
    dirs: tuple[Path, ...]

    def count(self) -> int:
        return sum(_lines(d / RECORDS) for d in self.dirs)

    def database(self) -> Any:
        """A MetaSchedule database over every shard (read by `compile_relax`)."""
        from tvm.s_tir import meta_schedule as ms

        dbs = [ms.database.JSONDatabase(path_workload=str(d / WORKLOADS),
                                        path_tuning_record=str(d / RECORDS),
                                        allow_missing=False) for d in self.dirs]
        return dbs[0] if len(dbs) == 1 else ms.database.UnionDatabase(*dbs)


MAX_RECORDS_BYTES = 1 << 30  # a records file larger than this is not one a tuning task wrote


def _lines(path: Path) -> int:
    """Records (non-blank lines) in a file of the database; 0 if it is not a regular file of
    at most MAX_RECORDS_BYTES. The control plane reads a service's database to say what it
    runs (`plinth show`): a FIFO, a device or a file of one endless line that a tenant put there
    must not stall it or fill its memory, so the file is opened without blocking and counted a
    block at a time."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return 0
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORDS_BYTES:
            return 0
        count, blank = 0, True
        while block := f.read(1 << 20):
            *ended, rest = block.split(b"\n")
            for line in ended:
                count += not (blank and not line.strip())
                blank = True
            blank = blank and not rest.strip()
        return count + (not blank)


def shares_tuned(db: str | Path, model_dir: str, target: str) -> dict[float, TunedRecords]:
    """Every share of one model and target that has at least one record, by share."""
    out: dict[float, TunedRecords] = {}
    root = Path(db) / model_dir / target
    for share_dir in sorted(root.glob("share-*")):
        dirs = tuple(d for d in sorted(share_dir.glob("shard-*")) if _lines(d / RECORDS))
        if dirs:
            share = float(share_dir.name.removeprefix("share-"))
            out[share] = TunedRecords(share, dirs)
    return out


def records_for(db: str | Path, model: str, target: str, share: float, *,
                input_shape: list[int] | tuple[int, ...] | None = None) -> TunedRecords | None:
    """The records tuned at the share nearest to `share` (ties: the larger share), or None if
    the model was not tuned on `target`. `model` is a model key, or a model name with its
    `input_shape`. A replica built at share s should run the kernels tuned at s (SLICE-TUNE)."""
    key = model if input_shape is None else model_key(model, input_shape)
    tuned = shares_tuned(db, key, target)
    if not tuned:
        return None
    best = min(tuned, key=lambda s: (abs(s - share), -s))
    return tuned[best]


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of `plinth tune show`."""

    model: str
    target: str
    share: float
    shards: int
    records: int
    tasks: int
    seconds: float | None


def listing(db: str | Path) -> list[Entry]:
    """What is tuned in a database, at which shares, sorted by model, target and share."""
    out = []
    root = Path(db)
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        for target_dir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
            for share, rec in shares_tuned(root, model_dir.name, target_dir.name).items():
                metas = [json.loads((d / META).read_text()) for d in rec.dirs
                         if (d / META).exists()]
                tasks = sum(_lines(d / WORKLOADS) for d in rec.dirs)
                seconds = max((m["seconds"] for m in metas), default=None)
                out.append(Entry(model_dir.name, target_dir.name, share, len(rec.dirs),
                                 rec.count(), tasks, seconds))
    return out


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    """Write a shard's summary atomically (a reader never sees half of it)."""
    tmp = folder / (META + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
    tmp.replace(folder / META)
