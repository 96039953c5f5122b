"""Files the control plane writes for a tenant's units, and reads back from them.

A tenant's jobs can write their own folder (``JOBS_DIR/TENANT``, see `plinth.control.users`).
Anything the control plane (root) did there by path, a write, a mkdir or a chown, a tenant could
send elsewhere with a link, a FIFO or a folder swapped in between: a root-only file would become
the tenant's. So the control plane never writes into a folder a tenant can write:

- What a controller hands its units (an FL task's ``app.yaml`` and tokens) lives in a folder of
  the control plane's own, which the tenant's jobs can read and cannot write or swap::

      JOBS_DIR/.plinth/                  0711 root             tenants pass through, cannot list
        TENANT/                          0750 root:its group
          workload-N/                    0750 root:its group
            app.yaml, leaf.token ...     0640 root:its group   (`Handout.write`)
            middle-K/ ...                0750, files 0640

  A file is written under a fresh name (``O_CREAT|O_EXCL|O_NOFOLLOW``) and renamed into place,
  and every folder is checked to be the control plane's own, never a link. With no jobs
  directory (a control plane that is not root runs every job as its own user) the same folders
  are ``$PLINTH_HOME/workloads/workload-N``.
- What the units write (checkpoints, results) stays in the tenant's folder, made there by the
  units themselves, as the tenant. The control plane never makes, chowns or reads anything in
  it: what a controller needs to know, the units report over the API
  (`plinth.runtime.report`).
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from plinth.core.errors import PlinthError

CONTROL = ".plinth"  # the control plane's folder in the jobs directory (no tenant name starts
#                      with a dot, see plinth.control.auth.TENANT_NAME)
FILE_MODE = 0o640
DIR_MODE = 0o750


def owned_dir(path: Path, mode: int, gid: int) -> Path:
    """`path`: a folder of this process's user with `mode` and group `gid`, made if missing.
    Its parent must be one that only this user can write. A link, or a folder of anyone else,
    there is refused, never followed."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise PlinthError(f"{path}: expected a folder of the control plane's own; refusing "
                          f"it ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise PlinthError(f"{path}: expected a folder owned by uid {os.geteuid()}, found "
                              f"uid {st.st_uid}; refusing it")
        if st.st_gid != gid:
            os.fchown(fd, -1, gid)  # through the descriptor: the folder checked, not a path
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


def _check_private(path: Path) -> None:
    """`path` must be a folder that only this process's user can change (the jobs directory)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PlinthError(f"{path}: the jobs directory must be a folder of uid {os.geteuid()} "
                          f"that no one else can write; refusing to write for tenants in it")


@dataclass(frozen=True, slots=True)
class Handout:
    """A workload's folder of files for its units: the control plane's own, readable by the
    tenant's group only."""

    dir: Path
    gid: int

    def write(self, name: str, text: str, mode: int = FILE_MODE) -> Path:
        """Write `name` (``FILE`` or ``FOLDER/FILE``) atomically; its path."""
        folder, _, base = name.rpartition("/")
        d = owned_dir(self.dir / folder, DIR_MODE, self.gid) if folder else self.dir
        tmp = d / f".{base}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.fchown(fd, -1, self.gid)
            os.fchmod(fd, mode)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                fd = -1
                f.write(text)
            os.replace(tmp, d / base)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return d / base

    def read(self, name: str) -> str | None:
        """A file written here before (the control plane's own), or None."""
        try:
            return (self.dir / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None


def handout(jobs_dir: Path | None, home: Path, tenant: str, gid: int, workload: str) -> Handout:
    """The folder `workload` of `tenant`'s handouts, made if missing: under the jobs directory
    when tenants run as their own users, else under `home` (see the module's docstring)."""
    if jobs_dir is None:
        top = owned_dir(home / "workloads", 0o700, os.getegid())
        return Handout(owned_dir(top / workload, 0o700, os.getegid()), os.getegid())
    _check_private(jobs_dir)
    top = owned_dir(jobs_dir / CONTROL, 0o711, os.getegid())
    mine = owned_dir(top / tenant, DIR_MODE, gid)
    return Handout(owned_dir(mine / workload, DIR_MODE, gid), gid)
