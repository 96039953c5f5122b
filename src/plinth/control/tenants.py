"""A control plane's tenants: the cluster and the policy their quotas make, the Unix user each
one's jobs run as (plinth.control.users), and the folders that are theirs.

Part of `plinth.control.service.ControlPlane`, which answers for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from plinth.control import tenantfs, users
from plinth.core.errors import SpecError
from plinth.core.resources import Cluster, TenantQuota
from plinth.sched.policies import make_policy
from plinth.sched.policies.base import Policy
from plinth.sched.quota import platform_quotas

if TYPE_CHECKING:
    from plinth.control.service import ControlPlane


def policy_options(policy: str, quotas: tuple[TenantQuota, ...] | None) -> dict:
    """The options the platform builds its policy with; a replay of its export uses the same."""
    if policy == "drf":  # tenants' quotas, and priority preemption inside a tenant
        return {"quotas": quotas, "preempt_within_tenant": True}
    return {}


class Tenants:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.names: frozenset[str] = frozenset()
        self.users: dict[str, str | None] = {}  # tenant -> the Unix user its jobs run as
        self.cluster: Cluster
        self.policy = self.rebuild()

    def rebuild(self) -> Policy:
        """(Re)build the cluster and the policy from the nodes and the tenants' quotas."""
        cp = self.cp
        rows = cp.store.tenants()
        quotas = platform_quotas(rows, sum(n.num_gpus for n in cp.nodes))
        self.names = frozenset(r["name"] for r in rows)
        self.users = {r["name"]: r["unix_user"] for r in rows}
        self.cluster = Cluster(tuple(cp.nodes), name="local", tenants=quotas)
        policy = make_policy(cp.policy_name, **policy_options(cp.policy_name, quotas or None))
        missing = sorted(policy.requires - cp.runtime.capabilities)
        if missing:
            raise SpecError(f"--policy: {policy.name} needs a runtime that can "
                            f"{' and '.join(missing)}; {type(cp.runtime).__name__} cannot")
        self.policy = policy
        return policy

    def set(self, name: str, gpus: float | None, borrowing_limit: float | None,
            user: str | None = None) -> str | None:
        """Create a tenant or change its quota (under the loop's lock); returns the Unix user
        its jobs run as (None: the server's)."""
        cp = self.cp
        user = self._user_for(name, user)
        cp.store.put_tenant(name, gpus, borrowing_limit, user)
        cp.owner.set_policy(self.rebuild(), self.cluster)
        return user

    def _user_for(self, tenant: str, asked: str | None) -> str | None:
        if self.cp.jobs_dir is None:  # not root: every job runs as the server's user
            if asked is not None:
                raise SpecError(f"user: tenants run as their own Unix users only when the "
                                f"control plane runs as root (it runs as uid {os.geteuid()})")
            return None
        if asked is not None:
            return users.existing_user(asked, "user").name
        return self.users.get(tenant) or users.ensure_user(tenant).name

    def run_as(self, tenant: str) -> str | None:
        """The Unix user `tenant`'s jobs run as: None (the server's own) when the control plane
        is not root; as root, the user the admin mapped it to, else one of its own
        (plinth-TENANT), `default` included: root is never a tenant's user."""
        store = self.cp.store
        if self.cp.jobs_dir is None:
            return None
        user = self.users.get(tenant)
        if user is None:  # a tenant stored before it had a user: `default`, made at bootstrap
            user = self.users[tenant] = users.ensure_user(tenant).name
            row = next((r for r in store.tenants() if r["name"] == tenant), None)
            if row is not None:  # `plinth tenant ls` says so
                store.put_tenant(tenant, row["gpus"], row["borrowing_limit"], user)
        return user

    def root(self, tenant: str, user: users.UnixUser | None) -> Path:
        """Where a tenant's jobs keep their state: under $PLINTH_HOME, or as root in the
        tenant's own folder of --jobs-dir."""
        cp = self.cp
        return (cp.home / "checkpoints" if cp.jobs_dir is None else
                users.tenant_dir(cp.jobs_dir, tenant, user))

    def workload_dir(self, workload_id: int, tenant: str) -> Path:
        """A workload's folder in its tenant's own: its units' state (checkpoints, results,
        status), made by the units themselves, as the tenant; the control plane makes nothing
        in it and reads nothing from it."""
        run_as = self.run_as(tenant)
        user = users.UnixUser.named(run_as) if run_as else None
        return self.root(tenant, user) / f"workload-{workload_id}"

    def workload_files(self, workload_id: int, tenant: str) -> tenantfs.Handout:
        """The folder of the files a workload's controller hands its units (an FL task's app
        and tokens): the control plane's own, which the tenant's jobs can read and cannot
        write or swap (see plinth.control.tenantfs); made if missing."""
        cp = self.cp
        run_as = self.run_as(tenant)
        gid = users.UnixUser.named(run_as).gid if run_as else os.getegid()
        return tenantfs.handout(cp.jobs_dir, cp.home, tenant, gid, f"workload-{workload_id}")
