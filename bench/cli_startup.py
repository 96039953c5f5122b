"""How long the `plinth` command line takes to start, and which heavy modules it imports.

Every unit the platform starts is a `python -m plinth.cli.main ...` (an FL server, a middle, a
leaf), and the tests run the CLI as a subprocess hundreds of times, so its start-up is paid
everywhere. Each case runs in a fresh interpreter: the wall time is the median of `--repeat`
runs; the import time is what `python -X importtime` counts for the whole run (the sum over the
top-level imports); the CPU time (user + system, median) is the figure to compare on a loaded
machine; `heavy` lists the large libraries the run imported.

    python bench/cli_startup.py [--repeat 7] [--src PATH] [--json PATH]

`--src` measures another checkout's `src` folder with this venv (put first on PYTHONPATH), for a
before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "scipy", "numba", "torch", "tvm", "fastapi", "starlette", "sqlalchemy",
         "httpx", "grpc", "pydantic", "yaml", "psutil")
# A case is a Python snippet run with `python -c`; the CLI ones run `plinth ARGS` in-process.
CLI = ("import runpy, sys\nsys.argv = ['plinth', *{args!r}]\n"
       "try:\n    runpy.run_module('plinth.cli.main', run_name='__main__')\n"
       "except SystemExit:\n    pass\n")
SPEC = ("import plinth.control.kinds\nfrom plinth.core.spec import load_spec\n"
        "load_spec({path!r})\n")
REPORT = ("\nimport sys\nprint('HEAVY', ','.join(m for m in {heavy!r} if m in sys.modules), "
          "file=sys.stderr)\n")
CASES = {
    "import plinth.cli.main": "import plinth.cli.main\n",
    "plinth --help": CLI.format(args=["--help"]),
    "plinth submit --help": CLI.format(args=["submit", "--help"]),
    "plinth ls --help": CLI.format(args=["ls", "--help"]),
    "plinth fl server --help": CLI.format(args=["fl", "server", "--help"]),
    "load a Job spec": SPEC.format(path="examples/jobs/train.yaml"),
    "load a Service spec": SPEC.format(path="examples/serve/service.yaml"),
    "load an FLTask spec": SPEC.format(path="examples/fl/task.yaml"),
}


def _import_ms(stderr: str) -> float:
    """The run's import time: the cumulative times of the top-level imports, summed."""
    total = 0
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if not name.startswith("  ") and cumulative.strip().isdigit():  # depth 0
                total += int(cumulative)
    return total / 1000


def measure(snippet: str, repeat: int, env: dict[str, str]) -> dict:
    code = snippet + REPORT.format(heavy=HEAVY)
    cmd = [sys.executable, "-c", code]
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, check=True)
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    heavy = next(line.split(" ", 1)[1] for line in done.stderr.splitlines()
                 if line.startswith("HEAVY ")) if "HEAVY " in done.stderr else ""
    return {"wall_ms": round(statistics.median(walls) * 1000),
            "cpu_ms": round(statistics.median(cpus) * 1000),
            "import_ms": round(_import_ms(done.stderr)), "heavy": [m for m in heavy.split(",") if m]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--src", help="another checkout's src folder, measured with this venv")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    env = {**os.environ, "COLUMNS": "100"}
    if args.src:
        env["PYTHONPATH"] = str(Path(args.src).resolve())
    rows = [{"case": name, **measure(snippet, args.repeat, env)}
            for name, snippet in CASES.items()]
    t = Table(title=f"CLI start-up ({args.src or 'this checkout'})")
    for col in ("case", "wall ms (p50)", "CPU ms (p50)", "import ms", "heavy modules imported"):
        t.add_column(col, justify="left" if col in ("case", "heavy modules imported") else "right")
    for r in rows:
        t.add_row(r["case"], str(r["wall_ms"]), str(r["cpu_ms"]), str(r["import_ms"]),
                  ", ".join(r["heavy"]) or "-")
    Console(width=140).print(t)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
