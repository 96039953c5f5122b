"""Trace and service-time loaders: good files load; every bad line names the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from plinth.core.errors import SpecError, TraceError
from plinth.serve.traces import load_azure_llm, load_counts, load_service_time, load_trace


def _write(tmp_path: Path, name: str, lines: list[object]) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


def _rec(ts: int, **counts: int) -> dict:
    return {"ts": ts, "counts": {k: {"classifier": v} for k, v in counts.items()}}


def test_loads_faro_jsonl_and_json_array(tmp_path: Path) -> None:
    recs = [_rec(0, a=3, b=0), _rec(1, a=5, b=2), _rec(2, a=0, b=7)]
    tr = load_counts(_write(tmp_path, "t.jsonl", recs))
    assert tr.jobs == ("a", "b") and tr.minutes == 3
    assert tr.counts.tolist() == [[3, 0], [5, 2], [0, 7]]
    arr = tmp_path / "input.json"
    arr.write_text(json.dumps(recs, indent=1))
    assert np.array_equal(load_counts(arr).counts, tr.counts)
    assert tr.window(1, 3).counts.tolist() == [[5, 2], [0, 7]]
    assert tr.first_jobs(1).jobs == ("a",)


@pytest.mark.parametrize(("line", "message"), [
    ('{"ts": 1, "counts": {"a": {"classifier": -4}}}', "negative count -4"),
    ('{"ts": 3, "counts": {"a": 1}}', "gap in minutes: ts 3 where 1 was expected"),
    ('{"ts": 1, "counts": {"a": 1, "zzz": 2}}', "unknown job 'zzz'"),
    ('{"ts": 1, "counts": {}}', "non-empty object"),
    ('{"ts": 1, "counts": {"a": 1.5}}', "not a whole number"),
    ('{"ts": 1, "counts": {"a": 1', "bad JSON"),
    ('{"counts": {"a": 1}}', "expected an object with 'ts'"),
])
def test_bad_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    p = _write(tmp_path, "bad.jsonl", [_rec(0, a=1), line])
    with pytest.raises(TraceError, match=message) as e:
        load_counts(p)
    assert str(e.value).startswith(f"{p}:2: ")
    assert "\n" not in str(e.value)


def test_missing_job_and_missing_file(tmp_path: Path) -> None:
    p = _write(tmp_path, "m.jsonl", [_rec(0, a=1, b=1), "", _rec(1, a=2)])
    with pytest.raises(TraceError, match=r"m\.jsonl:3: job 'b' is missing"):
        load_counts(p)
    with pytest.raises(TraceError, match="cannot read"):
        load_counts(tmp_path / "nope.jsonl")
    with pytest.raises(SpecError, match="--minutes"):
        load_counts(_write(tmp_path, "ok.jsonl", [_rec(0, a=1)])).window(5, 9)


def test_service_time_yaml(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("type: lognorm\nparams:\n  shape: 0.36\n  loc: 0.073\n  scale: 0.087\n")
    st = load_service_time(p)
    rng = np.random.default_rng(0)
    assert st.sample(rng, 200_000).mean() == pytest.approx(st.mean, rel=0.01)
    p.write_text("type: lognorm\nparams:\n  shape: -1\n  loc: 0\n  scale: 0.1\n")
    with pytest.raises(SpecError, match=r"s\.yaml: field 'params.shape' must be > 0"):
        load_service_time(p)
    p.write_text("type: gamma\nparams: {}\n")
    with pytest.raises(SpecError, match="field 'type'"):
        load_service_time(p)
    p.write_text("type: constant\nparams: {value: 0.2}\n")
    assert load_service_time(p).mean == 0.2


def test_azure_llm_csv_bins_per_minute(tmp_path: Path) -> None:
    p = tmp_path / "code.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.9799600,4808,10\n"
                 "2023-11-16 18:17:50.0000000,100,5\n"
                 "2023-11-16 18:19:10.5,100,5\n")
    tr = load_trace(p)
    assert tr.counts[:, 0].tolist() == [2, 0, 1]
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,1\nyesterday,1,1\n")
    with pytest.raises(TraceError, match=r"code\.csv:3: TIMESTAMP 'yesterday'"):
        load_azure_llm(p)
