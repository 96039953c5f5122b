"""A root control plane killed with SIGKILL again and again while two tenants submit and cancel
short jobs, then an audit of what came out of it (issue 36, finding 8: jobs ran twice after
kill -9). Shared by tests/control/test_kill_restart.py (a small run) and bench/kill_restart.py
(the full one); a module of its own name, as plinth_platform.py is.

The run: a real `plinth up` as root, tenants' jobs as their own Unix users under a jobs
directory. Client threads submit `jobs` jobs, each with a name unique to it, and cancel every
`cancel_every`-th right after its submission. Each job appends `start JOB ATTEMPT` to a file in
its HOME (the tenant's own folder), sleeps up to a third of a second, then appends `end JOB
ATTEMPT` (every `long_every`-th sleeps 1-5 s, so that restarts find jobs still running, and
launches forked but not journalled are found by their running shim, not only by their exit
file). The control plane is killed (SIGKILL) `kills` times, each when the number of accepted
submissions reaches a point drawn from the seed (then up to 0.1 s more), and restarted on
the same home and port. A submission that gets no answer may or may not exist: once the control
plane is back it is looked up by its name, and submitted again only if it is not there. A
submission answered 2xx must be in the store.

The audit, once every job is terminal and the control plane is stopped:
- lost: accepted (answered, or found by name), but not in the store or not terminal;
- duplicated: one submission stored as two jobs;
- run twice: a job whose command started more than once (distinct (job, attempt) starts; no
  job's process is killed here, so a second start means a launch that had started was taken for
  one that had not), and of those, the ones that ran to completion twice;
- succeeded but never ran: a job stored as succeeded without an `end` of its command;
- orphans: a process with a PLINTH_JOB_ID of this run, or a shim of this home, still alive.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections import Counter
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from plinth.cli.quickstart import kill_jobs, start_server
from plinth.client import ApiError, Client
from plinth.core.errors import PlinthError
from plinth.core.net import free_port
from plinth.core.lifecycle import State

TENANTS = ("crash-a", "crash-b")  # each gets a Unix user of its own, plinth-crash-a, ...
MAX_SLEEP_S = 0.33  # as `sleep 0.$RANDOM`
LONG_S = (1.0, 5.0)  # a long job's sleep: longer than a restart takes, often
RETRY_S = 0.05  # between tries at a control plane that is up but did not answer
RECOVERED = re.compile(r"(\d+) (pending|running re-adopted|ended while down|lost and requeued|"
                       r"cancelled)")


@dataclass(slots=True)
class Params:
    jobs: int = 1500
    kills: int = 20
    seed: int = 0
    threads: int = 2  # client threads submitting
    cancel_every: int = 7  # every n-th submission is cancelled right after it is accepted
    long_every: int = 5  # every n-th job sleeps LONG_S, so that a restart finds it running
    cpus: float = 0.02  # each job's request: at most 1/cpus of them run at once per CPU
    memory: str = "32Mi"
    server_src: str | None = None  # a source tree's src/ to run the control plane from
    timeout_s: float = 900.0  # for every job to become terminal after the last kill


@dataclass(slots=True)
class Audit:
    params: Params
    accepted: int = 0  # submissions that exist: answered 2xx, or found by name
    answered: int = 0  # of them, answered 2xx
    unanswered: int = 0  # submissions sent again or looked up after a failed try
    found_by_name: int = 0  # unanswered, yet stored: found by name, not submitted again
    cancels: int = 0
    kills: int = 0
    recovered: Counter = field(default_factory=Counter)  # summed over the restarts
    states: Counter = field(default_factory=Counter)
    attempts: Counter = field(default_factory=Counter)  # the store's attempt numbers
    lost_events: int = 0  # "lost" events in the store (requeued after a restart)
    lost: list[int] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    ran_twice: list[int] = field(default_factory=list)
    completed_twice: list[int] = field(default_factory=list)
    never_ran: list[int] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    starts: int = 0  # `start` lines: commands that began
    wall_s: float = 0.0
    details: list[str] = field(default_factory=list)  # each run-twice job's starts and events

    def to_dict(self) -> dict:
        return {"jobs": self.params.jobs, "kills_asked": self.params.kills,
                "seed": self.params.seed, "threads": self.params.threads,
                "cancel_every": self.params.cancel_every,
                "long_every": self.params.long_every,
                "server_src": self.params.server_src, "kills": self.kills,
                "accepted": self.accepted, "answered": self.answered,
                "unanswered": self.unanswered, "found_by_name": self.found_by_name,
                "cancels": self.cancels, "recovered": dict(self.recovered),
                "states": dict(self.states), "attempts": dict(self.attempts),
                "lost_events": self.lost_events, "starts": self.starts,
                "lost": self.lost, "duplicated": self.duplicated, "ran_twice": self.ran_twice,
                "completed_twice": self.completed_twice, "never_ran": self.never_ran,
                "orphans": self.orphans, "wall_s": self.wall_s, "details": self.details}


def run(params: Params) -> Audit:
    """One whole run in a fresh folder (removed after), as root."""
    root = Path(tempfile.mkdtemp(prefix="plinth-kill-"))
    root.chmod(0o755)  # the tenants' users must reach their folders of the jobs directory
    try:
        return _Run(root, params).go()
    finally:
        kill_jobs(root)  # whatever an audit found left running
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def _server_env(src: str | None):
    """The environment `start_server` hands `plinth up`: unbuffered, so that the lines it
    prints survive its SIGKILL, and with `src` first on its path when given."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONUNBUFFERED")}
    os.environ["PYTHONUNBUFFERED"] = "1"
    if src:
        os.environ["PYTHONPATH"] = src
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Run:
    def __init__(self, root: Path, params: Params) -> None:
        self.root, self.p = root, params
        self.home, self.jobs_dir = root / "home", root / "jobs"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.audit = Audit(params)
        self.rng = np.random.default_rng(params.seed)
        self.up = threading.Event()  # the control plane answers; cleared before each kill
        self.abort = threading.Event()  # the run failed: every thread gives up
        self.progress = threading.Condition()
        self.ids: dict[str, int] = {}  # submission name -> job id, under `progress`
        self.errors: list[BaseException] = []
        self.proc: subprocess.Popen | None = None
        self.stored: dict[int, tuple[str, str, int]] = {}  # job id -> (name, state, attempt)
        self.store_events: list[tuple[int, str, str]] = []  # (job id, kind, message)

    # ------------------------------------------------------------------ the run

    def go(self) -> Audit:
        t0 = time.monotonic()
        self._start()
        try:
            tokens = self._tenants()
            specs = self._specs()
            kill_at = np.sort(self.rng.choice(np.arange(1, self.p.jobs), self.p.kills,
                                              replace=False))
            jitter = self.rng.uniform(0, 0.1, self.p.kills)
            threads = [threading.Thread(target=self._submitter, name=f"submit-{i}", daemon=True,
                                        args=(tokens[TENANTS[i % len(TENANTS)]],
                                              specs[i::self.p.threads]))
                       for i in range(self.p.threads)]
            for t in threads:
                t.start()
            try:
                self._killer(kill_at, jitter)
            except BaseException as e:  # noqa: BLE001 -- the submitters give up, then it is raised
                self._fail(e)
            for t in threads:
                t.join()
            if self.errors:
                raise self.errors[0]
            self._wait_terminal()
        finally:
            self._stop()
        self._audit_store()
        self._audit_runs()
        self._audit_processes()
        self._audit_recoveries()
        self.audit.wall_s = time.monotonic() - t0
        return self.audit

    def _start(self) -> None:
        with _server_env(self.p.server_src):
            self.proc = start_server(self.home, self.port, "--jobs-dir", str(self.jobs_dir),
                                     "--fake-gpus", "1xA100",
                                     "--min-runtime", "0", "--grace", "1")
        self.up.set()

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _tenants(self) -> dict[str, str]:
        with Client(self.url, (self.home / "token").read_text().strip()) as admin:
            for t in TENANTS:
                admin.set_tenant(t)
            return {t: admin.add_token(t) for t in TENANTS}

    def _specs(self) -> list[tuple[int, str, dict]]:
        """(index, unique name, spec) of every submission, in order."""
        sleeps = self.rng.uniform(0, MAX_SLEEP_S, self.p.jobs)
        long = self.rng.uniform(*LONG_S, self.p.jobs)
        sleeps[self.p.long_every - 1::self.p.long_every] = long[self.p.long_every - 1::
                                                                self.p.long_every]
        out = []
        for i, s in enumerate(sleeps):
            script = ('echo start $PLINTH_JOB_ID $PLINTH_ATTEMPT >> "$HOME/ran"; '
                      f'sleep {s:.3f}; echo end $PLINTH_JOB_ID $PLINTH_ATTEMPT >> "$HOME/ran"')
            name = f"kr{self.p.seed}-{i}"
            out.append((i, name, {"name": name, "command": ["sh", "-c", script],
                                  "resources": {"cpus": self.p.cpus,
                                                "memory": self.p.memory}}))
        return out

    def _killer(self, kill_at: np.ndarray, jitter: np.ndarray) -> None:
        """SIGKILL the control plane when the accepted submissions reach each point of
        `kill_at` (and `jitter` seconds more), and start it again on the same home and port."""
        for at, extra in zip(kill_at, jitter, strict=True):
            with self.progress:
                self.progress.wait_for(lambda at=at: len(self.ids) >= at or self.errors)
            if self.errors:
                return
            time.sleep(float(extra))  # a random moment in whatever the control loop is doing
            self.up.clear()
            self.proc.kill()
            self.proc.wait()
            self.audit.kills += 1
            self._start()

    # ------------------------------------------------------------------ the tenants' side

    def _submitter(self, token: str, specs: list[tuple[int, str, dict]]) -> None:
        try:
            with Client(self.url, token) as c:
                for i, name, spec in specs:
                    job = self._submit(c, name, spec)
                    if i % self.p.cancel_every == self.p.cancel_every - 1:
                        self._retry(lambda j=job: c.cancel(j))
                        with self.progress:
                            self.audit.cancels += 1
        except BaseException as e:  # noqa: BLE001 -- handed to the main thread, which raises it
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        with self.progress:
            self.errors.append(e)
            self.abort.set()
            self.progress.notify_all()

    def _wait_up(self) -> None:
        while not self.up.wait(0.1):
            if self.abort.is_set():
                raise PlinthError("the run was abandoned: see the first error")

    def _submit(self, c: Client, name: str, spec: dict) -> int:
        """Submit once: after a try that got no answer, look the name up before trying again."""
        tried = False
        while True:
            if tried:
                page = self._retry(lambda: c.jobs_page(name=name, all=True, limit=2)[0])
                if page:
                    return self._accepted(name, int(page[0]["id"]), answered=False)
            try:
                job = c.submit(spec)
            except ApiError as e:
                if e.status < 500:
                    raise
            except PlinthError:
                pass
            else:
                return self._accepted(name, job, answered=True)
            if not tried:
                with self.progress:
                    self.audit.unanswered += 1
            tried = True
            self._wait_up()

    def _retry(self, call):
        """`call` until the control plane answers it (a 4xx is an answer: cancel after end)."""
        while True:
            self._wait_up()
            try:
                return call()
            except ApiError as e:
                if e.status < 500:
                    return None
            except PlinthError:
                pass
            time.sleep(RETRY_S)  # up, yet no answer: a connection left from before a kill

    def _accepted(self, name: str, job: int, *, answered: bool) -> int:
        with self.progress:
            self.ids[name] = job
            self.audit.accepted = len(self.ids)
            self.audit.answered += answered
            self.audit.found_by_name += not answered
            self.progress.notify_all()
        return job

    def _wait_terminal(self) -> None:
        """Until no job is pending, running or stopping (polled: there is nothing to wait on)."""
        deadline = time.monotonic() + self.p.timeout_s
        with Client(self.url, (self.home / "token").read_text().strip()) as admin:
            while self._retry(lambda: admin.jobs_page(limit=1)[1]):
                if time.monotonic() > deadline:
                    return  # whatever is still active is counted as lost
                time.sleep(0.2)

    # ------------------------------------------------------------------ the audit

    def _audit_store(self) -> None:
        with closing(sqlite3.connect(f"file:{self.home / 'plinth.db'}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT id, name, state, attempt FROM jobs").fetchall()
            self.store_events = db.execute(
                "SELECT job_id, kind, message FROM events ORDER BY id").fetchall()
        self.stored = {r[0]: (r[1], r[2], r[3]) for r in rows}
        a = self.audit
        a.states = Counter(r[2] for r in rows)
        a.attempts = Counter(r[3] for r in rows)
        a.lost_events = sum(1 for e in self.store_events if e[1] == "lost")
        names = Counter(r[1] for r in rows)
        a.duplicated = sorted(n for n, k in names.items() if k > 1)
        failed = sorted(j for j, row in self.stored.items() if row[1] == State.FAILED.value)
        if failed:  # every command here exits 0: show one such job's story
            log = self.home / "logs" / f"{failed[0]}.log"
            evs = "; ".join(f"{k}: {m}" for j, k, m in self.store_events if j == failed[0])
            a.details.append(f"job {failed[0]} failed; events: {evs}; log: "
                             f"{log.read_text(errors='replace')[-600:] if log.exists() else '-'}")
        for job in sorted(self.ids.values()):
            row = self.stored.get(job)
            if row is None or not State(row[1]).terminal:
                a.lost.append(job)

    def _audit_runs(self) -> None:
        starts: dict[int, list[int]] = {}
        ends: dict[int, list[int]] = {}
        for t in TENANTS:
            ran = self.jobs_dir / t / "ran"
            lines = ran.read_text().split("\n") if ran.exists() else []
            for line in filter(None, lines):
                what, job, attempt = line.split()
                (starts if what == "start" else ends).setdefault(int(job), []).append(
                    int(attempt))
        a = self.audit
        a.starts = sum(map(len, starts.values()))
        a.ran_twice = sorted(j for j, s in starts.items() if len(s) > 1)
        a.completed_twice = sorted(j for j, s in ends.items() if len(s) > 1)
        a.never_ran = sorted(j for j, (_, state, _) in self.stored.items()
                             if state == State.SUCCEEDED.value and j not in ends)
        for j in a.ran_twice:
            evs = "; ".join(f"{k}: {m}" for job, k, m in self.store_events if job == j)
            a.details.append(f"job {j}: started as attempts {starts[j]}, ended as "
                             f"{ends.get(j, [])}, stored {self.stored.get(j)}; events: {evs}")

    def _audit_processes(self) -> None:
        """Every process of this run still alive, now that no job is active and the control
        plane is stopped: a job's (PLINTH_JOB_ID, HOME in this run's folder) or a shim of this
        home (its exit file in the argv). Each is named, then killed."""
        home = str(self.home)
        for p in psutil.process_iter(["cmdline", "environ", "status"]):
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            env, cmd = p.info["environ"] or {}, p.info["cmdline"] or []
            job = "PLINTH_JOB_ID" in env and env.get("HOME", "").startswith(str(self.root))
            shim = any(a.endswith("plinth/runtime/shim.py") for a in cmd) and \
                any(a.startswith(home) for a in cmd)
            if job or shim:
                what = f"job {env['PLINTH_JOB_ID']}" if job else "shim"
                self.audit.orphans.append(f"pid {p.pid} ({what}): {' '.join(cmd)[:200]}")
                try:
                    os.killpg(p.pid, signal.SIGKILL) if shim else p.kill()
                except (OSError, psutil.Error):
                    pass

    def _audit_recoveries(self) -> None:
        for line in (self.home / "server.log").read_text(errors="replace").splitlines():
            if line.startswith("recovered"):
                for n, what in RECOVERED.findall(line):
                    self.audit.recovered[what] += int(n)
