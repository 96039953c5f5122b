"""One tenant's `array: 0-9999%1` against everyone else (issue 36, finding 4): the submit-to-
running latency of another tenant's trivial jobs while the array is held, the time SIGTERM takes
to stop `plinth up` while it is held, and the time to cancel the whole array.

    python bench/array_hold.py [--tasks 10000] [--victims 8] [--src /tmp/plinth-base/src]
        [--json F]

Each source tree runs in the same invocation, one after the other, on the same machine: `--src`
names another tree's `src` (the code before a change: `git archive REV src | tar -x -C
/tmp/plinth-base`, or a `git worktree add`), run as `PYTHONPATH=SRC python -m plinth.cli.main up`; this checkout's own runs last. Per tree:
a real `plinth up` (SQLite, 4 fake A100s; as root, each tenant its own Unix user), tenants
`flood` and `other` with their own tokens.

1. idle: `other` submits trivial jobs one at a time; each one's latency is from the submit
   call until the API no longer says pending (polled every 10 ms).
2. held: `flood` submits `array: 0-{tasks-1}%1` of `true`; then `other`'s jobs as in 1.
3. SIGTERM while the array is held: signal to process exit (killed after --stop-timeout).
4. restart: `plinth up` again, recovering the held array: until its API answers.
5. cancel: `plinth cancel ARRAY` (the API's cancel with array=true), until no task is left
   unfinished (given up after --cancel-timeout, with how many were cancelled by then).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from plinth.cli.quickstart import kill_jobs
from plinth.client import Client
from plinth.core.errors import PlinthError
from plinth.core.net import free_port

RES = {"cpus": 0.1, "memory": "64Mi"}
LIVE = ["pending", "running", "stopping"]


class Server:
    """`plinth up` from source tree `src`, on 127.0.0.1."""

    def __init__(self, src: Path, root: Path) -> None:
        self.src, self.home, self.port = src, root / "home", free_port()
        self.extra = ["--jobs-dir", str(root / "jobs")] if os.geteuid() == 0 else []
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300.0) -> float:
        """Start it; returns the seconds until its API answered."""
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(self.src)}
        t0 = time.monotonic()
        with open(self.home / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "plinth.cli.main", "up", "--home", str(self.home),
                 "--port", str(self.port), "--fake-gpus", "4xA100", "--grace", "2",
                 "--min-runtime", "0", *self.extra],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        with Client(self.url, token="-") as c:
            while True:
                try:
                    c.health()
                    return time.monotonic() - t0
                except PlinthError:
                    if self.proc.poll() is not None or time.monotonic() - t0 > timeout:
                        raise RuntimeError(f"plinth up from {self.src} did not start; see "
                                           f"{self.home / 'server.log'}") from None
                    time.sleep(0.05)

    def stop(self, timeout: float) -> float | None:
        """SIGTERM; the seconds until it exited, or None if it had to be killed."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
            return time.monotonic() - t0
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            self.proc = None

    def client(self, token: str | None = None, timeout: float = 30.0) -> Client:
        return Client(self.url, token or (self.home / "token").read_text().strip(),
                      timeout=timeout)


def latencies(c: Client, n: int, timeout: float) -> list[float]:
    """Submit-to-running of `n` trivial jobs, one at a time."""
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        job = c.submit({"name": "other", "command": ["true"], "resources": RES})
        while c.job(job)["state"] == "pending":
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"job {job} still pending after {timeout} s")
            time.sleep(0.01)
        out.append(time.monotonic() - t0)
    return out


def left(c: Client, head: int) -> int:
    return c.jobs_page(array=head, states=LIVE, limit=1)[1]


def run(src: Path, args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="plinth-bench-array-"))
    root.chmod(0o755)  # tenants' own users pass through to their folders under it
    s = Server(src, root)
    out: dict = {"src": str(src)}
    try:
        s.start()
        with s.client() as admin:
            for t in ("flood", "other"):
                admin.set_tenant(t)
            flood, other = admin.add_token("flood"), admin.add_token("other")
        with s.client(other) as c:
            latencies(c, 2, args.job_timeout)  # warm: the tenant's user, the first launch
            out["idle_s"] = latencies(c, args.victims, args.job_timeout)
        with s.client(flood, timeout=600) as c:
            t0 = time.monotonic()
            head = c.submit({"name": "flood", "command": ["true"], "resources": RES,
                             "array": f"0-{args.tasks - 1}%1"})
            out["submit_s"] = time.monotonic() - t0
        with s.client(other) as c:
            out["held_s"] = latencies(c, args.victims, args.job_timeout)
        with s.client() as c:
            out["held_at_stop"] = left(c, head)
        out["sigterm_s"] = s.stop(args.stop_timeout)
        out["restart_s"] = s.start()
        with s.client(flood, timeout=args.cancel_timeout) as c:
            before = left(c, head)
            t0 = time.monotonic()
            try:
                c.cancel(head, array=True)
            except PlinthError as e:  # the client gave up waiting for the answer
                print(f"  cancel: {e}", file=sys.stderr)
            while (n := left(c, head)) and time.monotonic() - t0 < args.cancel_timeout:
                time.sleep(0.05)
            out["cancel_s"] = time.monotonic() - t0 if n == 0 else None
            out["cancelled"] = before - n
            out["cancel_tasks"] = before
        out["final_stop_s"] = s.stop(args.stop_timeout)
    finally:
        if s.proc is not None:
            s.proc.kill()
            s.proc.wait()
        kill_jobs(s.home)
        shutil.rmtree(root, ignore_errors=True)
    return out


def q(xs: list[float], p: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1] if len(xs) > 1 else xs[0]


def secs(x: float | None, cap: float) -> str:
    return f"{x:.2f} s" if x is not None else f"> {cap:.0f} s (killed)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--victims", type=int, default=8, help="other tenant's jobs per phase")
    ap.add_argument("--src", type=Path, action="append", default=[],
                    help="another tree's src to run first (repeatable)")
    ap.add_argument("--job-timeout", type=float, default=120.0)
    ap.add_argument("--stop-timeout", type=float, default=30.0)
    ap.add_argument("--cancel-timeout", type=float, default=120.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = [*(p.resolve() for p in args.src), REPO / "src"]
    results = []
    for src in trees:
        print(f"running {src} ...", file=sys.stderr)
        results.append(run(src, args))
    t = Table(title=f"a {args.tasks:,}-task %1 array held; {args.victims} jobs of another tenant "
                    "per phase", box=None)
    t.add_column("")
    for r in results:
        t.add_column(r["src"], justify="right")
    rows = [
        ("other tenant, idle: median / p95",
         lambda r: f"{statistics.median(r['idle_s']):.2f} / {q(r['idle_s'], 95):.2f} s"),
        ("submitting the array", lambda r: f"{r['submit_s']:.2f} s"),
        ("other tenant, array held: median / p95",
         lambda r: f"{statistics.median(r['held_s']):.2f} / {q(r['held_s'], 95):.2f} s"),
        ("SIGTERM to exit, array held",
         lambda r: f"{secs(r['sigterm_s'], args.stop_timeout)} ({r['held_at_stop']} left)"),
        ("restart, recovering it", lambda r: f"{r['restart_s']:.2f} s"),
        ("cancelling the array",
         lambda r: (f"{r['cancel_s']:.2f} s ({r['cancel_tasks']} tasks)" if r["cancel_s"]
                    is not None else f"> {args.cancel_timeout:.0f} s ({r['cancelled']} of "
                    f"{r['cancel_tasks']} cancelled)")),
        ("SIGTERM to exit, after", lambda r: secs(r["final_stop_s"], args.stop_timeout)),
    ]
    for name, cell in rows:
        t.add_row(name, *(cell(r) for r in results))
    Console().print(t)
    if args.json:
        args.json.write_text(json.dumps({"tasks": args.tasks, "victims": args.victims,
                                         "runs": results}, indent=1))


if __name__ == "__main__":
    main()
