"""A real 2-node Ray cluster on 127.0.0.1 for the `ray` tests (and bench/ray_launch.py).

Both nodes run on this machine (ray.cluster_utils.Cluster: `ray start --address` refuses a
worker on loopback), each with every port set explicitly, its own fake GPU count, a rack (label
and custom resource), a plinth-node label that names it for the scheduler, and a small object
store. At the end Ray is shut down and every process it started is ended by pid.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

# Ray turns 127.0.0.1 into this machine's outside address unless told not to; read when Ray is
# first imported, so set before.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import psutil

from plinth.core.net import free_ports

OBJECT_STORE_BYTES = 200 * 2**20  # the machine has 24 GiB and 2 cores shared with others
# A node whose raylet is killed is declared dead after this many failed health checks, one a
# second (Ray's default, 5 every 3 s, makes a test of a departed node wait 15 s and more).
HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
WORKER_PORTS = 24  # Ray worker processes a node may run at once (one per actor)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: int
    cpus: int
    rack: str
    model: str = "A100"


HEAD = NodeSpec("ray-head", gpus=4, cpus=4, rack="r0")
WORKER = NodeSpec("ray-worker", gpus=2, cpus=4, rack="r1")


PORT_NAMES = ("node_manager_port", "object_manager_port", "metrics_export_port",
              "metrics_agent_port", "dashboard_agent_listen_port", "runtime_env_agent_port")


def _node_args(n: NodeSpec, tmp: str, ports: list[int]) -> dict:
    """A node's arguments, taking its ports from `ports` (distinct for the whole cluster)."""
    named = {k: ports.pop() for k in PORT_NAMES}
    return dict(node_ip_address="127.0.0.1", num_cpus=n.cpus, num_gpus=n.gpus,
                resources={f"rack:{n.rack}": 1, f"accelerator_type:{n.model}": 1},
                labels={"plinth-node": n.name, "rack": n.rack},
                object_store_memory=OBJECT_STORE_BYTES, temp_dir=tmp,
                worker_port_list=",".join(str(ports.pop()) for _ in range(WORKER_PORTS)),
                **named)


class LocalRayCluster:
    """Head and worker node, up until `shutdown`."""

    def __init__(self, nodes: tuple[NodeSpec, ...] = (HEAD, WORKER)) -> None:
        from ray._private.utils import get_ray_address_file
        from ray.cluster_utils import Cluster

        # Ray records the head's address in its default temp folder whatever `temp_dir` says,
        # and does not create that folder itself: on a fresh machine it is not there yet.
        os.makedirs(os.path.dirname(get_ray_address_file(None)), exist_ok=True)
        # Short: Ray's socket paths under it must fit in 107 bytes.
        self.tmp = tempfile.mkdtemp(prefix="plray-", dir="/tmp")
        ports = free_ports(len(nodes) * (len(PORT_NAMES) + WORKER_PORTS) + 2)
        head = _node_args(nodes[0], self.tmp, ports)
        head.update(gcs_server_port=ports.pop(), ray_client_server_port=ports.pop(),
                    include_dashboard=False, _system_config=HEALTH_CHECK)
        self.cluster = Cluster(initialize_head=True, head_node_args=head,
                               shutdown_at_exit=True)
        self.workers = {}  # name -> ray._private.node.Node
        for n in nodes[1:]:
            self.add_node(n, ports)
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address
        self.nodes = nodes

    def add_node(self, n: NodeSpec, ports: list[int] | None = None) -> None:
        """Start worker node `n` (again, after `kill_node`: a node that rejoins)."""
        ports = ports or free_ports(len(PORT_NAMES) + WORKER_PORTS)
        self.workers[n.name] = self.cluster.add_node(**_node_args(n, self.tmp, ports))

    def kill_node(self, name: str) -> None:
        """Kill every process of worker node `name` at once, as a machine that dies: its
        raylet and the rest of Ray's, and the workers and jobs under it. They are all stopped
        first, so that none sees another end before it ends itself."""
        node = self.workers.pop(name)
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        under = raylet.children(recursive=True)
        for p in under:
            p.suspend()
        self.cluster.remove_node(node, allow_graceful=False)
        for p in under:
            p.kill()
        psutil.wait_procs(under, timeout=10)

    def pids(self) -> set[int]:
        """Every process of the cluster: this process's descendants that Ray started."""
        out = set()
        for p in psutil.Process().children(recursive=True):
            try:
                if self.tmp in " ".join(p.cmdline()) or p.name() in ("raylet", "gcs_server"):
                    out.add(p.pid)
            except psutil.Error:
                pass
        return out

    def shutdown(self) -> None:
        import ray

        pids = self.pids()
        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()
        for pid in pids:  # whatever Cluster.shutdown left, by pid
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        psutil.wait_procs([p for p in map(_proc, pids) if p], timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
