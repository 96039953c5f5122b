"""`plinth up`: the control plane process (store + runtime + scheduler loop + REST API)."""

from __future__ import annotations

import ipaddress
import logging
import os
import pwd
import socket
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from plinth.control import lease as lease_mod
from plinth.control.api import create_app
from plinth.control.auth import Auth
from plinth.control.bodylimit import DEFAULT_MAX_BODY_BYTES
from plinth.control.lease import Lease
from plinth.control.service import ControlPlane
from plinth.control.store import Store, normalise_url
from plinth.control.users import can_isolate, lock_down, unreachable
from plinth.core.errors import PlinthError, SpecError
from plinth.runtime.local import LocalRuntime
from plinth.runtime.procs import LOG_LIMIT_MIB
from plinth.sched.types import SchedConfig
from plinth.serve.policies import POLICIES
from plinth.tune import spec as tune_spec

DEFAULT_PORT = 8642
# After SIGTERM, requests still being answered get this long before the server stops anyway:
# no request (a long cancel, a slow client) can keep `plinth up` from stopping.
SHUTDOWN_S = 5.0


@dataclass(frozen=True, slots=True)
class ServerConfig:
    home: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    db: str | None = None  # SQLAlchemy URL; default: SQLite at $PLINTH_HOME/plinth.db
    fake_gpus: str | None = None
    runtime: str = "local"  # or "ray" (plinth.runtime.ray), on the cluster at ray_address
    ray_address: str | None = None
    fence_after_s: float = 10.0  # with Ray: a node's workers die this long after losing the head
    policy: str = "drf"
    grace_s: float = 10.0
    min_runtime_s: float = 30.0  # a job runs this long before it may be preempted
    round_s: float = 360.0  # lease length of the round-based policies (Gavel, Themis)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies are answered 413
    tls_cert: Path | None = None  # serve HTTPS with this certificate chain (PEM) ...
    tls_key: Path | None = None  # ... and its private key
    # Where tenants' jobs keep their checkpoints when each tenant runs as its own Unix user
    # (as root); default: PLINTH_HOME-jobs next to PLINTH_HOME. See plinth.control.users.
    jobs_dir: Path | None = None
    # Services (plinth.serve.workload): the autoscaling policy, its tick, and the wall seconds
    # of one minute of arrivals history (less than 60 replays a trace faster). Each service's
    # router is a unit of its own, placed on a node, not a part of this process.
    serve_policy: str = "faro-fairsum"
    serve_tick_s: float = 10.0
    serve_minute_s: float = 60.0
    log_limit_mib: int = LOG_LIMIT_MIB  # a job's log is cut at this size (0: never)

    @property
    def tenant_jobs_dir(self) -> Path | None:
        """The jobs directory if tenants run as their own users (root), else None."""
        if not can_isolate():
            return None
        return (self.jobs_dir or self.home.with_name(self.home.name + "-jobs")).resolve()

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{(self.home / 'plinth.db').resolve()}"


def build(cfg: ServerConfig, lease: Lease) -> tuple[ControlPlane, Auth]:
    """The control plane, recovered from the store, with its loop not yet started. `lease`:
    this process's hold on the store (`take_lease`), taken before anything here touches it."""
    if cfg.grace_s < 0:
        raise SpecError(f"--grace: must be >= 0, got {cfg.grace_s}")
    if cfg.log_limit_mib < 0:
        raise SpecError(f"--log-limit: must be >= 0 MiB, got {cfg.log_limit_mib}")
    cfg.home.mkdir(parents=True, exist_ok=True)
    store = Store(cfg.db_url)
    auth = Auth(store)
    auth.bootstrap(cfg.home)
    holder: list[ControlPlane] = []
    notify = lambda: holder[0].notify() if holder else None
    if cfg.runtime == "ray":
        # Only when asked for: it brings the Ray runtime's modules, which most servers never use.
        from plinth.runtime.ray import make_ray_runtime

        runtime = make_ray_runtime(cfg.ray_address, fake_gpus=cfg.fake_gpus, notify=notify,
                                   fence_after_s=cfg.fence_after_s)
    elif cfg.runtime != "local":
        raise SpecError(f"--runtime: expected local or ray, got {cfg.runtime!r}")
    else:
        runtime = LocalRuntime(cfg.home / "runtime", fake_gpus=cfg.fake_gpus, notify=notify,
                               log_limit_mib=cfg.log_limit_mib)
    if not any(n.num_gpus for n in runtime.nodes()):
        runtime.close()
        raise SpecError("no GPU found (NVML); declare virtual ones with --fake-gpus 4xA100")
    if cfg.round_s <= 0:
        raise SpecError(f"--round: must be > 0 seconds, got {cfg.round_s}")
    config = SchedConfig(min_runtime=cfg.min_runtime_s, round_s=cfg.round_s)
    tune_spec.IMPORT_MODELS = False  # this process never imports a user's model

    POLICIES.check(cfg.serve_policy, field="--serve-policy")
    if cfg.serve_tick_s <= 0 or cfg.serve_minute_s <= 0:
        raise SpecError("--serve-tick and --serve-minute: must be > 0 seconds")
    service = {"policy": cfg.serve_policy, "tick_s": cfg.serve_tick_s,
               "minute_s": cfg.serve_minute_s}
    cp = ControlPlane(store, runtime, home=cfg.home, policy=cfg.policy, config=config,
                      grace_s=cfg.grace_s, jobs_dir=cfg.tenant_jobs_dir,
                      kinds={"Service": service})
    lock_down(cfg.home, cfg.tenant_jobs_dir)
    holder.append(cp)
    return cp, auth


def take_lease(cfg: ServerConfig, port: int) -> Lease:
    """The lease on the configured store, for a control plane serving on `port`; a second
    control plane on the same store gets `LeaseHeld`, one line naming the holder (see
    plinth.control.lease)."""
    if cfg.db is None:  # the default store, in the home: make the home for it first
        cfg.home.mkdir(parents=True, exist_ok=True)
    return lease_mod.acquire(normalise_url(cfg.db_url), port=port)


def isolation_notes(cfg: ServerConfig, python: str = sys.executable) -> list[str]:
    """Lines for `plinth up`: how tenants' jobs are kept apart on this machine, and what their
    own users cannot reach (the jobs directory, the platform's Python)."""
    jobs_dir = cfg.tenant_jobs_dir
    if jobs_dir is None:
        user = pwd.getpwuid(os.geteuid()).pw_name
        return [(f"note: tenants share one Unix user ({user}) and are isolated only at the "
                 "API; run `plinth up` as root to give each tenant's jobs a user of its own")]
    notes = [f"tenants' jobs run as their own Unix users; their folders are under {jobs_dir}"]
    blocked = unreachable(jobs_dir)
    if blocked is not None:
        notes = [(f"warning: tenants' jobs cannot reach --jobs-dir {jobs_dir} ({blocked} is "
                  "closed to other users), so they cannot save checkpoints; give a --jobs-dir "
                  "that others may pass through")]
    # A job's `python` is the platform's first (its PATH starts with the interpreter's folder):
    # behind a folder closed to others (a pyenv under /root) a tenant's jobs find another one.
    blocked = unreachable(Path(python))
    if blocked is not None:
        notes.append(f"warning: tenants' jobs cannot run this server's Python ({python}: "
                     f"{blocked} is closed to other users), so `python` in their specs is "
                     "another one, without its packages; install it where others can read it")
    return notes


def check_network(cfg: ServerConfig) -> list[str]:
    """Refuse bad network options in one line each; return the warnings to print."""
    if not 0 <= cfg.port <= 65535:
        raise SpecError(f"--port: must be in 0..65535, got {cfg.port}")
    if cfg.max_body_bytes < 1024:
        raise SpecError(f"--max-body: must be at least 1024 bytes, got {cfg.max_body_bytes}")
    if (cfg.tls_cert is None) != (cfg.tls_key is None):
        raise SpecError("--tls-cert and --tls-key: give both or neither")
    if cfg.tls_cert is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                cfg.tls_cert, cfg.tls_key)
        except (OSError, ssl.SSLError) as e:
            raise SpecError(f"--tls-cert/--tls-key: cannot load {cfg.tls_cert} and "
                            f"{cfg.tls_key}: {getattr(e, 'strerror', None) or e}") from None
        return []
    if not _loopback(cfg.host):
        return [(f"warning: --host {cfg.host} without TLS: API tokens and job specs cross the "
                 "network in clear text; give --tls-cert and --tls-key")]
    return []


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(cfg: ServerConfig, *, announce=print) -> None:
    """Run until SIGINT or SIGTERM; running jobs are left running for the next start to adopt."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    warnings = check_network(cfg)
    # Bind first: a port in use is a one-line error before anything else starts.
    sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as e:
        sock.close()
        raise PlinthError(f"--port: cannot listen on {cfg.host}:{cfg.port}: {e.strerror}") from None
    # The lease before anything else of the store: a second control plane must not adopt the
    # running one's jobs, or write a token, before it finds that it is second.
    lease = take_lease(cfg, sock.getsockname()[1])
    try:
        cp, auth = build(cfg, lease)
    except BaseException:
        lease.release()
        sock.close()
        raise
    port = sock.getsockname()[1]
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host  # for units here
    host = f"[{host}]" if ":" in host else host
    cp.api_url = f"{'https' if cfg.tls_cert else 'http'}://{host}:{port}"
    cp.api_ca = cfg.tls_cert.read_text() if cfg.tls_cert else None
    cp.start()
    app = create_app(cp, auth, max_body_bytes=cfg.max_body_bytes)
    tls = {} if cfg.tls_cert is None else {"ssl_certfile": str(cfg.tls_cert),
                                            "ssl_keyfile": str(cfg.tls_key)}
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                                           access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=SHUTDOWN_S, **tls))
    scheme = "https" if tls else "http"
    announce(f"plinth control plane on {scheme}://{cfg.host}:{cfg.port} (pid {os.getpid()}), "
             f"store {cfg.db_url} (held: {lease.what}), {cp.cluster.describe()}, "
             f"policy {cfg.policy}, "
             f"isolation {getattr(cp.runtime, 'isolation', '?')}")
    announce(f"dashboard {scheme}://{cfg.host}:{cfg.port}/ui, metrics at /metrics")
    for note in isolation_notes(cfg):
        announce(note)
    announce(cp.recovery.summary())
    for w in warnings:
        announce(w)
    try:
        server.run(sockets=[sock])
    finally:
        cp.close()
        lease.release()
