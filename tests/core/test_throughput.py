"""The throughput matrix: the built-in one, Gavel's JSON and the CSV format, and one-line errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from plinth.core.errors import SpecError
from plinth.core.resources import Request
from plinth.core.throughput import (
    DEFAULT_THROUGHPUTS,
    FIXED_SPEED,
    JOB_TYPES,
    THROUGHPUT,
    Throughputs,
)
from plinth.core.workload import Job

# Gavel's layout (scheduler/simulation_throughputs.json): worker type -> "(name, scale)" ->
# {"null": alone, "(other job, scale)": [co-located pair]}. Numbers made up for the test.
GAVEL = {
    "v100": {
        "('ResNet-18 (batch size 16)', 1)": {"null": 40.0, "('A3C', 1)": [1.0, 2.0]},
        "('ResNet-18 (batch size 16)', 2)": {"null": 70.0},
        "('A3C', 1)": {"null": 5.0},
        "('LM (batch size 5)', 4)": {"null": 8.0},
    },
    "k80": {
        "('ResNet-18 (batch size 16)', 1)": {"null": 10.0},
        "('ResNet-18 (batch size 16)', 2)": {"null": 0.0},  # scale 2 is not used
        "('A3C', 1)": {"null": 4.0},
        "('LM (batch size 5)', 4)": {"null": 2.0},
    },
    "v100_unconsolidated": {"('A3C', 1)": {"null": 1.0}},  # not a GPU model: skipped
    "p100": {"('A3C', 1)": 6.0},  # a plain number is accepted too
}


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def load_error(path: str) -> str:
    with pytest.raises(SpecError) as e:
        Throughputs.load(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(path), msg
    return msg


def test_builtin_matrix_is_the_table():
    for jtype, row in THROUGHPUT.items():
        for model, v in row.items():
            assert DEFAULT_THROUGHPUTS.speed(jtype, model) == v
    # Unmeasured model or unknown type: the catalog's speed relative to a V100.
    assert DEFAULT_THROUGHPUTS.speed("resnet50", "H100") == pytest.approx(3.2)
    assert DEFAULT_THROUGHPUTS.speed("no-such-type", "K80") == pytest.approx(0.25)
    assert DEFAULT_THROUGHPUTS.speed(FIXED_SPEED, "K80") == 1.0
    assert DEFAULT_THROUGHPUTS.speed("resnet50", None) == 1.0
    # Untyped jobs are spread over the types by id, as before the matrix was an object.
    assert [DEFAULT_THROUGHPUTS.job_type_for(i) for i in range(50)] == \
        [JOB_TYPES[(i * 2654435761) % len(JOB_TYPES)] for i in range(50)]
    typed = Job(3, 0.0, 1.0, Request(gpus=1), job_type="lm")
    assert DEFAULT_THROUGHPUTS.type_of(typed) == "lm"
    assert DEFAULT_THROUGHPUTS.type_of(Job(3, 0.0, 1.0, Request(gpus=1))) == \
        DEFAULT_THROUGHPUTS.job_type_for(3)


def test_speeds_row_is_cached_and_read_only():
    row = DEFAULT_THROUGHPUTS.speeds("a3c", ("V100", "K80", "H100"))
    assert row.tolist() == pytest.approx([1.0, 0.6, 3.2])
    assert DEFAULT_THROUGHPUTS.speeds("a3c", ("V100", "K80", "H100")) is row
    with pytest.raises(ValueError):
        row[0] = 2.0


def test_gavel_json_is_normalised_against_the_v100(tmp_path):
    thr = Throughputs.load(write(tmp_path, "gavel.json", json.dumps(GAVEL)))
    assert set(thr.types) == {"ResNet-18 (batch size 16)", "A3C", "LM (batch size 5)"}
    assert set(thr.models) == {"V100", "K80", "P100"}
    assert thr.speed("ResNet-18 (batch size 16)", "K80") == pytest.approx(10 / 40)  # scale 1
    assert thr.speed("A3C", "K80") == pytest.approx(4 / 5)
    assert thr.speed("A3C", "P100") == pytest.approx(6 / 5)
    assert thr.speed("A3C", "V100") == 1.0
    # Only measured at scale 4: that row is used, still relative to the V100.
    assert thr.speed("LM (batch size 5)", "K80") == pytest.approx(2 / 8)
    # Not measured on P100: the catalog's P100 speed.
    assert thr.speed("ResNet-18 (batch size 16)", "P100") == pytest.approx(0.6)
    assert thr.source.endswith("gavel.json")
    assert thr.job_type_for(7) in thr.types


def test_csv_is_normalised_too_and_matches_the_json(tmp_path):
    csv = ("job_type,V100,K80,P100\n"
           "ResNet-18 (batch size 16),40,10,\n"
           "A3C,5,4,6\n"
           "\n"
           "LM (batch size 5),8,2,\n")
    a = Throughputs.load(write(tmp_path, "thr.csv", csv))
    b = Throughputs.load(write(tmp_path, "gavel.json", json.dumps(GAVEL)))
    for t in b.types:
        for m in ("V100", "K80", "P100", "T4"):
            assert a.speed(t, m) == pytest.approx(b.speed(t, m)), (t, m)
    assert math.isnan(a.matrix[0, 2])  # an empty cell is "not measured"


def test_unknown_types_names_the_first_job_of_each():
    jobs = [Job(i, 0.0, 1.0, Request(gpus=1), job_type=t)
            for i, t in enumerate(["lm", "bert", "", FIXED_SPEED, "bert", "gpt"])]
    unknown = DEFAULT_THROUGHPUTS.unknown_types(jobs)
    assert list(unknown) == ["bert", "gpt"] and unknown["bert"].id == 1


@pytest.mark.parametrize("text, expected", [
    ('{"v100": {"A3C": {"null": -1}}}', "v100 -> A3C -> null: expected a positive throughput, "
                                        "got -1"),
    ('{"v100": {"A3C": {"null": "fast"}}}', "v100 -> A3C -> null: expected a positive "
                                            "throughput, got 'fast'"),
    ('{"v100": {"A3C": {"(\'B\', 1)": [1, 2]}}}', 'v100 -> A3C: no "null" entry'),
    ('{"z80": {"A3C": 1.0}}', "worker type 'z80': unknown GPU model 'z80'"),
    ('{"v100": {"(\'A3C\', 0)": 1.0}}', "v100 -> ('A3C', 0): expected a job type like"),
    ('{"v100": ["A3C"]}', "v100: expected an object of job types, got list"),
    ('{"k80": {"A3C": 1.0}}', "job type 'A3C' has no V100 throughput"),
    ('{"v100": {"A3C": 1.0},\n "k80": }', ":2: not valid JSON"),
])
def test_bad_json_is_one_line_naming_key_and_value(tmp_path, text, expected):
    msg = load_error(write(tmp_path, "bad.json", text))
    assert expected in msg, msg


@pytest.mark.parametrize("text, expected", [
    ("type,V100\nA3C,1\n", ":1: expected a header job_type,<GPU model>,..."),
    ("job_type,V100,Z80\nA3C,1,1\n", ":1: column 'Z80': unknown GPU model 'Z80'"),
    ("job_type,V100,K80\nA3C,1\n", ":2: expected 3 fields, got 2"),
    ("job_type,V100,K80\nA3C,1,1\nLM,2,abc\n", ":3: LM,K80: expected a positive throughput, "
                                              "got 'abc'"),
    ("job_type,V100,K80\nA3C,1,0\n", ":2: A3C,K80: expected a positive throughput, got '0'"),
    ("job_type,V100\nA3C,1\nA3C,2\n", ":3: job_type 'A3C' appears twice"),
    ("job_type,K80\nA3C,1\n", "job type 'A3C' has no V100 throughput"),
    ("job_type,V100\n", "no job types"),
])
def test_bad_csv_is_one_line_naming_line_and_value(tmp_path, text, expected):
    msg = load_error(write(tmp_path, "bad.csv", text))
    assert expected in msg, msg


def test_missing_file(tmp_path):
    assert "cannot read throughputs" in load_error(str(tmp_path / "nope.json"))


def test_from_table_keeps_relative_speeds():
    thr = Throughputs.from_table({"x": {"V100": 1.0, "K80": 0.5}}, source="mine")
    assert thr.speed("x", "K80") == 0.5 and thr.describe().startswith("mine")
    assert np.array_equal(thr.speeds("x", ("K80", "V100")), [0.5, 1.0])
