"""API tokens and tenants.

A token belongs to one tenant; an admin token may act for every tenant. Only the SHA-256 of a
token is stored. On first start the control plane creates the tenant ``default`` and an admin
token, written to ``$PLINTH_HOME/token`` (mode 0600), which the CLI and `plinth.Client` read when
no token is given, as kubectl reads its kubeconfig.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from plinth.control.store import Store, digest
from plinth.core.errors import SpecError

TENANT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    admin: bool = False

    def may_see(self, tenant: str) -> bool:
        return self.admin or tenant == self.tenant


def new_token() -> str:
    return "plt_" + secrets.token_urlsafe(24)


def check_tenant_name(name: str) -> str:
    if not TENANT_NAME.match(name):
        raise SpecError(f"tenant: {name!r} must be lower-case letters, digits and '-' "
                        "(a DNS label, as a Kubernetes namespace)")
    return name


class Auth:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._tokens = store.tokens()

    def bootstrap(self, home: Path) -> str | None:
        """Create the default tenant and an admin token on first start; return the token then."""
        if any(admin for _, admin, _ in self._tokens.values()):
            return None
        if not any(t["name"] == "default" for t in self.store.tenants()):
            self.store.put_tenant("default", None, None)
        token = self.add_token("default", admin=True)
        path = home / "token"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token

    def add_token(self, tenant: str, admin: bool = False, expires: float | None = None) -> str:
        """A new token for `tenant`, valid until `expires` (a wall-clock time; None: until
        revoked)."""
        token = new_token()
        with self._lock:
            self.store.add_token(token, tenant, admin, expires)
            self._tokens[digest(token)] = (tenant, admin, expires)
        return token

    def revoke(self, token_id: str) -> bool:
        """Revoke the token with this id at once; False if there is no such token."""
        with self._lock:
            gone = self.store.revoke_token(token_id)
            if gone is not None:
                self._tokens.pop(gone, None)
        return gone is not None

    def principal(self, token: str | None, now: float | None = None) -> Principal | None:
        if not token:
            return None
        found = self._tokens.get(digest(token))
        if found is None:
            return None
        tenant, admin, expires = found
        if expires is not None and (now if now is not None else time.time()) >= expires:
            return None
        return Principal(tenant, admin)
