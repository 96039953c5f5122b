"""The whole platform on PostgreSQL (`plinth up --db postgresql://…`), through the same code as
SQLite, including a SIGKILL and restart."""

from __future__ import annotations

import signal
import uuid

import psycopg


def test_platform_on_postgres(postgres_url, tmp_path, platform_factory) -> None:
    db = f"plinth_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    url = postgres_url.rsplit("/", 1)[0] + f"/{db}"
    p = platform_factory(tmp_path / "home", "--db", url).start()
    try:
        with p.client() as c:
            assert c.wait(c.submit({"name": "pg", "command": "echo on-postgres",
                                    "resources": {"cpus": 0.1, "memory": "1Gi", "gpus": 1}}),
                          timeout=60) == "succeeded"
            queued = c.submit({"name": "big", "command": "true", "tenant": "default",
                               "resources": {"cpus": 0.1, "memory": "1Gi", "gpus": 4},
                               "max_runtime": 60})
        p.stop(signal.SIGKILL)
        p.start()
        with p.client() as c:
            names = {j["name"]: j for j in c.jobs(all=True)}
            assert names["pg"]["state"] == "succeeded" and "big" in names
            assert c.wait(queued, timeout=60) == "succeeded"
        assert not (tmp_path / "home" / "plinth.db").exists()  # nothing went to SQLite
    finally:
        p.stop()
        p.kill_jobs()
