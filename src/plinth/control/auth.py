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
        if any(admin for _, admin in self._tokens.values()):
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

    def add_token(self, tenant: str, admin: bool = False) -> str:
        token = new_token()
        with self._lock:
            self.store.add_token(token, tenant, admin)
            self._tokens[digest(token)] = (tenant, admin)
        return token

    def principal(self, token: str | None) -> Principal | None:
        if not token:
            return None
        found = self._tokens.get(digest(token))
        return Principal(*found) if found else None
