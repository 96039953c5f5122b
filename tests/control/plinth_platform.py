"""A control plane run as a user runs it, for the platform tests: a real `plinth up` process on
127.0.0.1 (plain or TLS), and the `plinth` CLI against it. A module of its own, not conftest.py,
so that tests import it by a name no other test folder uses."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from plinth.core.net import free_port


class Platform:
    """A control plane running as a real process (`plinth up`) on 127.0.0.1."""

    def __init__(self, home: Path, *extra: str, fake_gpus: str | None = "4xA100") -> None:
        """`fake_gpus`: its --fake-gpus; None for a runtime with GPUs of its own (Ray). As
        root, tenants' jobs (the admin's `default` among them) run as their own users, so
        their folders go under a --jobs-dir they can reach (pytest's folders are root's
        alone): one of the test's own unless it names one."""
        if "--jobs-dir" in extra:
            self.jobs_dir = Path(extra[extra.index("--jobs-dir") + 1])
        elif os.geteuid() == 0:
            self.jobs_dir = Path(tempfile.mkdtemp(prefix="plinth-jobs-"))
            self.jobs_dir.chmod(0o755)
            extra = (*extra, "--jobs-dir", str(self.jobs_dir))
        else:  # not root: tenants share the server's user, and this folder is not used
            self.jobs_dir = home.with_name(home.name + "-jobs")
        self.home, self.extra = home, extra
        self.fake_gpus = fake_gpus
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return (self.home / "token").read_text().strip()

    def start(self) -> Platform:
        from plinth.cli.quickstart import start_server

        gpus = ("--fake-gpus", self.fake_gpus) if self.fake_gpus else ()
        self.proc = start_server(self.home, self.port, *gpus, "--grace", "2", "--min-runtime", "0",
                                 *self.extra)
        return self

    def stop(self, sig: int = 15) -> None:
        from plinth.cli.quickstart import stop_server

        if self.proc is not None:
            stop_server(self.proc, sig)
            self.proc = None

    def client(self, token: str | None = None):
        from plinth.client import Client

        return Client(self.url, token or self.token)

    def await_health(self, log: Path) -> Platform:
        """Wait until the server started by hand answers; its `log` is shown if it died."""
        import time

        from plinth.core.errors import PlinthError

        deadline = time.monotonic() + 60
        while True:
            try:
                with self.client("-") as c:
                    c.health()
                return self
            except PlinthError:
                assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)

    def launched(self, job_id: int) -> bool:
        """Whether the store holds the job's launch (its handle). "running" is recorded when the
        scheduler starts a job, before its processes are forked: a control plane killed between
        the two finds nothing to re-adopt, so a restart test waits for this too."""
        import sqlite3
        from contextlib import closing

        with closing(sqlite3.connect(f"file:{self.home / 'plinth.db'}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT handle FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row is not None and json.loads(row[0] or "null") is not None  # JSON null: none

    def kill_jobs(self) -> None:
        from plinth.cli.quickstart import kill_jobs

        kill_jobs(self.home, self.jobs_dir)
        if self.jobs_dir.name.startswith("plinth-jobs-"):  # made here
            shutil.rmtree(self.jobs_dir, ignore_errors=True)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost that is its own CA, and its key (openssl)."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


class TlsPlatform(Platform):
    """A control plane serving HTTPS with a self-signed certificate made here."""

    def __init__(self, home: Path, *extra: str) -> None:
        self.cert, self.key = self_signed(home.parent / "tls")
        super().__init__(home, "--tls-cert", str(self.cert), "--tls-key", str(self.key), *extra)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> Platform:
        import sys

        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "server.log", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "plinth.cli.main", "up", "--home", str(self.home),
                 "--port", str(self.port), "--fake-gpus", "4xA100", "--grace", "2", *self.extra],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self.await_health(self.home / "server.log")

    def client(self, token: str | None = None):
        from plinth.client import Client

        return Client(self.url, token or self.token, ca_cert=str(self.cert))


def run_cli(platform: Platform, *args: str, token: str | None = None, columns: int = 200,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """`plinth ARGS` as a user runs it, against `platform`."""
    import sys

    env = {**os.environ, "COLUMNS": str(columns), "PLINTH_SERVER": platform.url,
           "PLINTH_TOKEN": token or platform.token, **(env or {})}
    return subprocess.run([sys.executable, "-m", "plinth.cli.main", *args], check=False,
                          capture_output=True, text=True, timeout=120, env=env)


def with_shims(procs: list) -> list:
    """`procs` (a job's processes, found by their environment) and the runtime's shims that
    run them: killed together, as a lost node would be, they leave no exit code (lost), where
    the command alone killed is a job that failed with 137."""
    import psutil

    out = list(procs)
    for p in procs:
        try:
            parent = p.parent()
            if parent is not None and any(a.endswith("runtime/shim.py")
                                          for a in parent.cmdline()):
                out.append(parent)
        except psutil.Error:
            pass
    return out


def reachable(path: Path) -> Path:
    """`path`, made a folder tenants' jobs can use. As root, every tenant's jobs (the admin's
    `default` among them) run as its own Unix user, and pytest's folders are root's alone
    (0700): `path` becomes 1777 (as /tmp) and each folder above it passable (o+x). Nothing
    changes when not root, where jobs run as the test's own user."""
    if os.geteuid() == 0:
        path.chmod(0o1777)
        for p in path.parents:
            mode = p.stat().st_mode
            if not mode & 0o001:
                p.chmod((mode & 0o7777) | 0o001)
    return path


def tenants_own(path: Path, tenant: str = "default") -> Path:
    """`path`, made the tenant's own file, as it would be had the tenant written it: as root,
    its jobs run as its own Unix user, who must read what the test wrote for them (a tokens
    file, 0600). Nothing changes when not root."""
    if os.geteuid() == 0:
        from plinth.control.users import ensure_user

        user = ensure_user(tenant)
        os.chown(path, user.uid, user.gid)
    return path


@contextlib.contextmanager
def tenant_platform(*tenants: str, extra: tuple[str, ...] = ()) -> Iterator[Platform]:
    """A control plane in a folder of its own that tenants' users can pass through (`p.root`;
    its --jobs-dir is `p.root / "jobs"`), with `tenants` and a token for each (`p.tokens`): as
    root, each tenant's jobs run as its own Unix user. Stopped, its jobs killed and its folder
    removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="plinth-tenants-"))
    root.chmod(0o755)  # /tmp/pytest-of-root is 0700: no tenant's user could reach it
    p = Platform(root / "home", "--jobs-dir", str(root / "jobs"), *extra).start()
    p.root = root
    try:
        with p.client() as admin:
            for t in tenants:
                admin.set_tenant(t)
            p.tokens = {t: admin.add_token(t) for t in tenants}
        yield p
    finally:
        p.stop()
        p.kill_jobs()
        shutil.rmtree(root, ignore_errors=True)
