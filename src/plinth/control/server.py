"""`plinth up`: the control plane process (store + runtime + scheduler loop + REST API)."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from plinth.control.api import create_app
from plinth.control.auth import Auth
from plinth.control.service import ControlPlane
from plinth.control.store import Store
from plinth.core.errors import PlinthError, SpecError
from plinth.sched.types import SchedConfig

DEFAULT_PORT = 8642


@dataclass(frozen=True, slots=True)
class ServerConfig:
    home: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    db: str | None = None  # SQLAlchemy URL; default: SQLite at $PLINTH_HOME/plinth.db
    fake_gpus: str | None = None
    policy: str = "drf"
    grace_s: float = 10.0
    min_runtime_s: float = 30.0  # a job runs this long before it may be preempted
    round_s: float = 360.0  # lease length of the round-based policies (Gavel, Themis)

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{(self.home / 'plinth.db').resolve()}"


def build(cfg: ServerConfig) -> tuple[ControlPlane, Auth]:
    """The control plane, recovered from the store, with its loop not yet started."""
    from plinth.runtime.local import LocalRuntime

    if cfg.grace_s < 0:
        raise SpecError(f"--grace: must be >= 0, got {cfg.grace_s}")
    cfg.home.mkdir(parents=True, exist_ok=True)
    store = Store(cfg.db_url)
    auth = Auth(store)
    auth.bootstrap(cfg.home)
    holder: list[ControlPlane] = []
    runtime = LocalRuntime(cfg.home / "runtime", fake_gpus=cfg.fake_gpus,
                           notify=lambda: holder[0].notify() if holder else None)
    if not any(n.num_gpus for n in runtime.nodes()):
        runtime.close()
        raise SpecError("no GPU found (NVML); declare virtual ones with --fake-gpus 4xA100")
    if cfg.round_s <= 0:
        raise SpecError(f"--round: must be > 0 seconds, got {cfg.round_s}")
    config = SchedConfig(min_runtime=cfg.min_runtime_s, round_s=cfg.round_s)
    cp = ControlPlane(store, runtime, home=cfg.home, policy=cfg.policy, config=config,
                      grace_s=cfg.grace_s)
    holder.append(cp)
    return cp, auth


def serve(cfg: ServerConfig, *, announce=print) -> None:
    """Run until SIGINT or SIGTERM; running jobs are left running for the next start to adopt."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    # Bind first: a port in use is a one-line error before anything else starts.
    sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as e:
        sock.close()
        raise PlinthError(f"--port: cannot listen on {cfg.host}:{cfg.port}: {e.strerror}") from None
    cp, auth = build(cfg)
    cp.start()
    app = create_app(cp, auth)
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                                           access_log=False, lifespan="off"))
    announce(f"plinth control plane on http://{cfg.host}:{cfg.port} (pid {os.getpid()}), "
             f"store {cfg.db_url}, {cp.cluster.describe()}, policy {cfg.policy}, "
             f"isolation {getattr(cp.runtime, 'isolation', '?')}")
    try:
        server.run(sockets=[sock])
    finally:
        cp.close()
