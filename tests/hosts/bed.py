"""A test bed of several hosts on this one machine, made of Linux namespaces (it needs root).

Each host is a network namespace with one address on a veth link to a bridge (198.18.0.0/24,
the range reserved for network tests), loopback up, no default route, and nothing routed
beyond the links; and a mount and UTS namespace of its own: its own hostname, and a private
`/tmp` and `/dev/shm` (tmpfs), so that nothing can rely on a folder shared with another host.
One folder outside `/tmp`, `shared`, stands in for the cluster's shared storage (as NFS would).
The bridge lives in a namespace of its own, so the machine's own network is not touched; a
partition is its end of a host's link set down.

A host is held by an anchor process (`sleep`) that owns its mount namespace; every process run
on the host enters the anchor's namespaces. Killing a host kills every process in its network
namespace, the anchor too, as a machine that dies; `start_host` boots it again, empty.

Everything made is removed by `down`, which a fixture calls even when a test fails: each process
found in the namespaces is killed by pid, then the namespaces (and with them the links and the
bridge) are deleted, then the shared folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SUBNET = "198.18.0"
PREFIX = 24


def skip_reason() -> str | None:
    """Why the bed cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the multi-host bed makes network and mount namespaces, which needs root"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"the multi-host bed needs `{tool}` (iproute2 / util-linux)"
    return None


def wait_for(cond: Callable[[], object], what: str, timeout: float = 180.0) -> object:
    """Poll `cond` until it returns something truthy (its value); fail naming `what` at the
    deadline. The one polling loop of the bed and its tests."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Host:
    name: str
    address: str
    netns: str
    veth: str  # the bridge's end of its link, in the switch namespace
    anchor: subprocess.Popen | None = None


class Bed:
    """`hosts` hosts named h1, h2, ... at 198.18.0.1, .2, ...; up after `up()`."""

    def __init__(self, hosts: int = 3) -> None:
        self.id = uuid.uuid4().hex[:6]
        self.switch = f"plb{self.id}-sw"
        self.hosts = {f"h{i}": Host(f"h{i}", f"{SUBNET}.{i}", f"plb{self.id}-h{i}",
                                    f"v{self.id}h{i}") for i in range(1, hosts + 1)}
        # Outside /tmp, which each host has its own of; readable by tenants' users.
        self.root = Path(tempfile.mkdtemp(prefix=f"plinth-bed-{self.id}-", dir="/var/tmp"))
        self.root.chmod(0o755)
        self.shared = self.root / "shared"
        self.shared.mkdir(mode=0o755)
        self.procs: list[subprocess.Popen] = []  # what run() started, to end by pid

    # ------------------------------------------------------------------ making it

    def up(self) -> Bed:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for h in self.hosts.values():
            _ip("netns", "add", h.netns)
            _ip("-n", h.netns, "link", "set", "lo", "up")
            _ip("link", "add", h.veth, "netns", self.switch, "type", "veth", "peer", "name",
                "eth0", "netns", h.netns)
            _ip("-n", self.switch, "link", "set", h.veth, "master", "br0", "up")
            _ip("-n", h.netns, "addr", "add", f"{h.address}/{PREFIX}", "dev", "eth0")
            _ip("-n", h.netns, "link", "set", "eth0", "up")
            self.start_host(h.name)
        return self

    def start_host(self, name: str) -> None:
        """Boot host `name`: an anchor holding a fresh mount and UTS namespace, with an empty
        private /tmp and /dev/shm."""
        h = self.hosts[name]
        boot = (f"hostname {h.name} && mount -t tmpfs -o mode=1777 tmpfs /tmp && "
                "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && echo up && exec sleep infinity")
        h.anchor = subprocess.Popen(
            ["ip", "netns", "exec", h.netns, "unshare", "--mount", "--uts",
             "--propagation", "private", "sh", "-c", boot],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = h.anchor.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != b"up":
            raise RuntimeError(f"host {name}: did not boot (exit {h.anchor.wait()})")

    # ------------------------------------------------------------------ using it

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` as run on `host`: in its network, mount and UTS namespaces."""
        anchor = self.hosts[host].anchor
        assert anchor is not None, f"host {host} is down"
        return ["nsenter", "-t", str(anchor.pid), "--net", "--mount", "--uts", "--", *argv]

    def run(self, host: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start `argv` on `host`; it is ended by `down` if it still runs then."""
        p = subprocess.Popen(self.argv(host, argv), **kw)
        self.procs.append(p)
        return p

    def sh(self, host: str, argv: list[str], *, timeout: float = 120,
           check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run `argv` on `host` to its end; its output as text."""
        done = subprocess.run(self.argv(host, argv), capture_output=True, text=True, check=False,
                              timeout=timeout, **kw)
        if check and done.returncode:
            raise RuntimeError(f"on {host}: {' '.join(argv)} exited {done.returncode}: "
                               f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done

    def pids(self, host: str) -> list[int]:
        """Every process in `host`'s network namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.hosts[host].netns],
                             capture_output=True, text=True, check=False).stdout
        return [int(p) for p in out.split()]

    # ------------------------------------------------------------------ faults

    def partition(self, host: str) -> None:
        """Cut `host` off: its link goes down at the bridge (its processes run on)."""
        _ip("-n", self.switch, "link", "set", self.hosts[host].veth, "down")

    def heal(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[host].veth, "up")

    def kill_host(self, host: str) -> None:
        """Every process of `host` killed at once, as a machine that dies. Stopped first, so
        that none sees another end before it ends itself."""
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in self.pids(host):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        wait_for(lambda: not self.pids(host), f"host {host}'s processes to die", timeout=10)
        anchor = self.hosts[host].anchor
        if anchor is not None:
            anchor.wait(timeout=10)
            self.hosts[host].anchor = None

    # ------------------------------------------------------------------ removing it

    def down(self) -> None:
        for h in self.hosts.values():
            try:
                self.kill_host(h.name)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        for ns in [h.netns for h in self.hosts.values()] + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
