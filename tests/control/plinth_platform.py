"""A control plane run as a user runs it, for the platform tests: a real `plinth up` process on
127.0.0.1 (plain or TLS), and the `plinth` CLI against it. A module of its own, not conftest.py,
so that tests import it by a name no other test folder uses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from plinth.core.net import free_port


class Platform:
    """A control plane running as a real process (`plinth up`) on 127.0.0.1."""

    def __init__(self, home: Path, *extra: str, fake_gpus: str | None = "4xA100") -> None:
        """`fake_gpus`: its --fake-gpus; None for a runtime with GPUs of its own (Ray)."""
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

        kill_jobs(self.home)


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
        import time

        from plinth.core.errors import PlinthError

        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "server.log", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "plinth.cli.main", "up", "--home", str(self.home),
                 "--port", str(self.port), "--fake-gpus", "4xA100", "--grace", "2", *self.extra],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with self.client("-") as c:
                    c.health()
                return self
            except PlinthError:
                assert self.proc.poll() is None and time.monotonic() < deadline, \
                    (self.home / "server.log").read_text()
                time.sleep(0.1)

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
