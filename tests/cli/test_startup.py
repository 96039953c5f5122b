"""The command line starts without the heavy libraries: every unit the platform starts is a
`python -m plinth.cli.main ...`, so what its start-up imports is paid everywhere (see
bench/cli_startup.py for the times)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = ("import runpy, sys\nsys.argv = ['plinth', *{args!r}]\n"
       "try:\n    runpy.run_module('plinth.cli.main', run_name='__main__')\n"
       "except SystemExit:\n    pass\n")
SPEC = "import plinth.control.kinds\nfrom plinth.core.spec import load_spec\nload_spec({path!r})\n"
# Typer itself imports pydantic to read a command's parameters; a spec load needs it too.
NEVER = {"scipy", "numba", "torch", "tvm", "fastapi", "sqlalchemy", "grpc"}


def _imported(snippet: str, watch: set[str]) -> set[str]:
    code = (snippet + "\nimport json, sys\n"
            f"print(json.dumps([m for m in {sorted(watch)!r} if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(("snippet", "not_even"), [
    (CLI.format(args=["--help"]), {"numpy", "pydantic", "httpx", "yaml"}),
    (CLI.format(args=["submit", "--help"]), {"numpy", "httpx", "yaml"}),
    (CLI.format(args=["fl", "server", "--help"]), {"numpy", "httpx", "yaml"}),
    (SPEC.format(path="examples/jobs/train.yaml"), {"numpy"}),
    (SPEC.format(path="examples/serve/service.yaml"), {"numpy"}),
    (SPEC.format(path="examples/fl/task.yaml"), set()),
], ids=["help", "submit-help", "fl-server-help", "job-spec", "service-spec", "fltask-spec"])
def test_start_up_imports_no_heavy_library(snippet: str, not_even: set[str]) -> None:
    assert _imported(snippet, NEVER | not_even) == set()
