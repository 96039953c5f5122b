"""Tenants isolated on the machine, as Slurm does it: each tenant's jobs run as its own Unix user.

This holds when the control plane runs as root. A tenant is mapped to an existing user
(`plinth tenant set NAME --user USER`) or gets one of its own, ``plinth-NAME``, created the first
time it is set. The server's own files stay its own: `$PLINTH_HOME` and everything in it (the
store, the tokens, the server's logs, the runtime's exit files) are 0700 or 0600, owned by the
server. What a job may touch lies elsewhere, under the jobs directory:

    JOBS_DIR/                0755 root
      TENANT/                0700 the tenant's user: its jobs' checkpoints, and their HOME
        JOB/                 made by the job itself when it first saves
        workload-N/          a workload's units' state (an FL server's rounds), made by them
      .plinth/               0711 root: the control plane's own, which tenants pass through
        TENANT/              0750 root:the tenant's group
          workload-N/        0750 root:group: what a controller hands its units (an FL task's
                             app and tokens), files 0640, which the jobs read and cannot change

The control plane (root) makes only `TENANT/` in the tenant's part, in a folder no tenant can
write, and never writes, makes or chowns anything inside it: a tenant could plant a link or a
FIFO there. What it hands units goes to `.plinth/` (see plinth.control.tenantfs), and what it
reads back from a tenant's folder it reads only as that tenant's regular files.

A job's log is written through a descriptor the server opens, in `$PLINTH_HOME/logs` (0700), and
the file belongs to the tenant's user. The tenant `default` (the admin's) is a tenant like any
other: it runs as `plinth-default` unless the admin maps it to another user. Root is never a
tenant's user.

When the control plane is not root, every tenant's jobs run as its one user, and tenants are
isolated only at the API; `plinth up` says so once.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from plinth.core.errors import PlinthError, SpecError

USER_PREFIX = "plinth-"
MAX_USER_NAME = 32  # useradd's limit


def can_isolate() -> bool:
    return os.geteuid() == 0


@dataclass(frozen=True, slots=True)
class UnixUser:
    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def named(cls, name: str) -> UnixUser:
        p = pwd.getpwnam(name)
        return cls(p.pw_name, p.pw_uid, p.pw_gid, p.pw_dir)


def user_for(tenant: str) -> str:
    """The name of the user made for `tenant`: plinth-TENANT, shortened with a hash if long."""
    name = USER_PREFIX + tenant
    if len(name) <= MAX_USER_NAME:
        return name
    tag = hashlib.sha256(tenant.encode()).hexdigest()[:6]
    return f"{USER_PREFIX}{tenant[:MAX_USER_NAME - len(USER_PREFIX) - 7]}-{tag}"


def existing_user(name: str, field: str = "--user") -> UnixUser:
    """An existing user a tenant may run as; root is refused (it would undo the isolation)."""
    try:
        user = UnixUser.named(name)
    except KeyError:
        raise SpecError(f"{field}: no Unix user {name!r} on this machine") from None
    if user.uid == 0:
        raise SpecError(f"{field}: a tenant cannot run as {name!r} (uid 0)")
    return user


def ensure_user(tenant: str) -> UnixUser:
    """The user made for `tenant`, created (a system user without a login shell or a home of
    its own: its jobs get their tenant's folder as HOME) if it is not there yet."""
    name = user_for(tenant)
    try:
        return UnixUser.named(name)
    except KeyError:
        pass
    cmd = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
           "/nonexistent", "--shell", "/usr/sbin/nologin", "--comment",
           f"plinth tenant {tenant}", name]
    for attempt in range(20):  # another useradd may hold the lock on /etc/passwd
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode in (0, 9):  # 9: made meanwhile by someone else
            return UnixUser.named(name)
        if r.returncode != 1 or attempt == 19:
            raise PlinthError(f"tenant {tenant}: cannot create Unix user {name}: "
                              f"{r.stderr.strip() or f'useradd exited {r.returncode}'}")
        time.sleep(0.1)
    raise AssertionError("unreachable")


def tenant_dir(jobs_dir: Path, tenant: str, user: UnixUser | None) -> Path:
    """JOBS_DIR/TENANT, 0700 and owned by the tenant's user; made if missing. A path that is
    not a plain directory of that user (a link planted there) is refused, never followed."""
    d = jobs_dir / tenant
    uid, gid = (user.uid, user.gid) if user else (os.geteuid(), os.getegid())
    try:
        os.mkdir(d, 0o700)
        os.chown(d, uid, gid, follow_symlinks=False)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise PlinthError(f"{d}: expected a directory owned by uid {uid}; refusing to use it")
    return d


def lock_down(home: Path, jobs_dir: Path | None) -> None:
    """$PLINTH_HOME and what is in it: the server's alone. The jobs directory: traversable,
    so that each tenant reaches its own folder in it and nothing else."""
    home.chmod(0o700)
    for p in home.iterdir():
        if not p.is_symlink():
            p.chmod(0o700 if p.is_dir() else 0o600)
    if jobs_dir is not None:
        jobs_dir.mkdir(parents=True, exist_ok=True)
        jobs_dir.chmod(0o755)


def unreachable(path: Path) -> Path | None:
    """The first folder above `path` that other users cannot pass through, if any."""
    for p in [*reversed(path.resolve().parents), path.resolve()]:
        if p.exists() and not p.stat().st_mode & stat.S_IXOTH:
            return p
    return None
