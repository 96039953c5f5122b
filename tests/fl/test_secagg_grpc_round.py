"""A SecAgg+ round of more clients than the transport's default reply bound, over real gRPC.

`plinth fl server` (`run_server`) on 127.0.0.1 and 10 real clients of the app (`AppClients`
runners behind `GrpcClient`s). SecAgg+ keeps every client's reply to a stage until the stage
closes; with the transport's default bound of 8 whole replies the last two waited for room
past `straggler_timeout` and became dropouts in every 10-client round (found running
`examples/fl/mnist/secagg.yaml` through `run_grpc.sh` while auditing issue 19).
"""

import threading
from pathlib import Path

import yaml

from plinth.fl.app import load_app
from plinth.fl.client import AppClients
from plinth.fl.deploy import run_server
from plinth.fl.transport.grpc import GrpcClient

TINY = Path(__file__).parent / "apps" / "tiny.py"
N = 10


def test_a_secagg_round_of_ten_grpc_clients_keeps_all_ten(tmp_path):
    app = tmp_path / "app.yaml"
    app.write_text(yaml.safe_dump({
        "name": "t", "code": str(TINY), "seed": 0,
        "data": {"source": "digits", "partition": "iid", "clients": N},
        "train": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "server": {"rounds": 1, "fraction": 1.0, "min_clients": N, "min_available": N,
                   "straggler_timeout": 20, "wait_timeout": 60},
        "privacy": {"secagg": {"threshold": 0.5}}}))
    spec = load_app(str(app), {})
    clients = AppClients(spec, N)
    stop = threading.Event()

    def start_clients(_spec, port: int) -> None:
        for i in range(N):
            client = GrpcClient(f"127.0.0.1:{port}", client_id=str(i), connect_timeout=30)
            threading.Thread(target=client.serve, args=(clients.runner(i).handle, stop),
                             daemon=True).start()

    records = []
    try:
        run_server(str(app), address="127.0.0.1:0", require_tokens=False,
                   on_listen=start_clients, on_round=records.append)
    finally:
        stop.set()
    (rec,) = records
    assert rec.failures == [], rec.failures
    assert rec.metrics["secagg_survivors"] == N and not rec.metrics.get("secagg_aborted")
