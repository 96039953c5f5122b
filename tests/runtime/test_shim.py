"""The shim on its own: exit codes as a shell reports them, written atomically."""

from __future__ import annotations

import subprocess

import pytest
from conftest import PY

from plinth.runtime.local import SHIM


@pytest.mark.parametrize(("argv", "code"), [
    (["/bin/sh", "-c", "exit 0"], 0),
    (["/bin/sh", "-c", "exit 9"], 9),
    (["/bin/sh", "-c", "kill -TERM $$"], 143),
    (["/no/such/program"], 127),
])
def test_exit_code_file(tmp_path, argv, code):
    exit_file = tmp_path / "exit"
    r = subprocess.run([PY, "-I", SHIM, str(exit_file), "--", *argv], capture_output=True,
                       check=False)
    assert r.returncode == code and exit_file.read_text() == f"{code}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["exit"]


def test_usage_error(tmp_path):
    r = subprocess.run([PY, "-I", SHIM, str(tmp_path / "exit")], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 2 and "usage" in r.stderr
