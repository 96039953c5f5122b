"""The tuning database's layout, `records_for`'s choice of share, and `plinth tune show`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from plinth.cli.tune import app
from plinth.tune.db import META, RECORDS, WORKLOADS, listing, records_for, shard_dir

MODEL, SHAPE = "pkg.models:net", [1, 8]


def _tuned(db, share, records=2, shards=1, target="cpu"):
    for i in range(shards):
        d = shard_dir(db, MODEL, SHAPE, target, share, i, shards)
        d.mkdir(parents=True)
        (d / WORKLOADS).write_text('["w"]\n')
        (d / RECORDS).write_text("[0, []]\n" * records)
        (d / META).write_text(json.dumps({"seconds": 12.5 + i}))


def test_records_for_picks_the_nearest_share_with_records(tmp_path):
    for share in (25, 50, 100):
        _tuned(tmp_path, share, shards=2 if share == 50 else 1, target="cuda")
    empty = shard_dir(tmp_path, MODEL, SHAPE, "cuda", 30, 0, 1)
    empty.mkdir(parents=True)  # a share whose client has measured nothing yet is not tuned

    def pick(share):
        return records_for(tmp_path, MODEL, "cuda", share, input_shape=SHAPE)

    assert pick(30).share == 25 and pick(37.5).share == 50  # a tie goes to the larger share
    assert pick(70).share == 50 and pick(80).share == 100 and pick(1).share == 25
    assert len(pick(50).dirs) == 2 and pick(50).count() == 4
    assert records_for(tmp_path, MODEL, "cpu", 2, input_shape=SHAPE) is None
    assert records_for(tmp_path, "other:model", "cuda", 50, input_shape=SHAPE) is None


def test_listing_and_tune_show(tmp_path):
    _tuned(tmp_path, 1, records=3)
    _tuned(tmp_path, 2, records=5, shards=2)
    entries = listing(tmp_path)
    assert [(e.share, e.records, e.shards, e.tasks, e.seconds) for e in entries] == \
        [(1.0, 3, 1, 1, 12.5), (2.0, 10, 2, 2, 13.5)]
    result = CliRunner().invoke(app, ["show", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "pkg.models-net-1x8" in result.output and "2 cores" in result.output
    empty = CliRunner().invoke(app, ["show", str(tmp_path / "none")])
    assert empty.exit_code != 0
