"""Credentials scoped to one attempt of one unit's job, for its reports (`plinth.runtime.report`).

A unit's token is `plu_JOB_ATTEMPT_MAC`: the MAC (HMAC-SHA256) of the job and attempt under a key
of the control plane's own, drawn from the OS CSPRNG on first use and kept in `$PLINTH_HOME`
(0600), so tokens outlive a restart of the control plane as the units that hold them do. It
proves which attempt sends a report and grants nothing else: it is not an API token, and it
names no tenant. A report with a token of an attempt that has been replaced is refused (fenced)
by the control plane, which knows each unit's current attempt.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from plinth.core.errors import PlinthError

KEY_FILE = "unit.key"
_TOKEN = re.compile(r"^plu_(\d{1,12})_(\d{1,9})_([A-Za-z0-9_-]{43})$")


class BadCredential(PlinthError):
    """Not a unit token of this control plane."""


@functools.cache
def _key(home: Path) -> bytes:
    path = home / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) != 32:
            raise PlinthError(f"{path}: expected a 32-byte key; remove it to make a new one "
                              "(running units then need new attempts to report)") from None
        return key
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def _mac(home: Path, job_id: int, attempt: int) -> str:
    digest = hmac.new(_key(home), f"{job_id}:{attempt}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def token(home: Path, job_id: int, attempt: int) -> str:
    return f"plu_{job_id}_{attempt}_{_mac(home, job_id, attempt)}"


def verify(home: Path, text: str) -> tuple[int, int]:
    """(job id, attempt) of a valid token; `BadCredential` otherwise."""
    m = _TOKEN.match(text or "")
    if m is None:
        raise BadCredential("not a unit token")
    job_id, attempt = int(m[1]), int(m[2])
    if not hmac.compare_digest(m[3], _mac(home, job_id, attempt)):
        raise BadCredential("not a unit token of this control plane")
    return job_id, attempt
