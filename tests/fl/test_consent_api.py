"""Consent through the server's API, bound to the client's token (issue 19, finding 4).

A real `Server` on a real `GrpcTransport` (127.0.0.1, per-client tokens) and three real gRPC
clients. Each grants consent as itself; one client revokes in the middle of round 2, so its
round-2 update is refused on arrival and round 3 does not select it. The audit log says so and
exports to CSV and JSON lines.
"""

import csv
import json
import threading
import time

import numpy as np
import pytest

from plinth.core.errors import PlinthError
from plinth.fl.app import parse_app
from plinth.fl.client import ClientRunner
from plinth.fl.privacy.consent import ConsentRegistry, ConsentService, export_audit
from plinth.fl.safeguards import Safeguards
from plinth.fl.server import Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport.grpc import GrpcClient, GrpcTransport

TOKENS = {"tok-a": "a", "tok-b": "b", "tok-c": "c"}


class _Client:
    """Adds 1 to every parameter; `on_fit(round)` runs inside fit (c revokes there)."""

    def __init__(self, on_fit=None) -> None:
        self.on_fit = on_fit

    def fit(self, parameters, config):
        if self.on_fit is not None:
            self.on_fit(int(config["round"]))
        return [p + 1 for p in parameters], 5, {}

    def evaluate(self, parameters, config):
        return 0.0, 5, {}


@pytest.fixture
def server(tmp_path):
    db = tmp_path / "consent.sqlite"
    spec = parse_app({"name": "t", "consent": {"purpose": "p", "registry": str(db),
                                                 "task_id": "t1"},
                      "server": {"fraction": 1.0, "min_clients": 2, "min_available": 3,
                                 "straggler_timeout": 30, "wait_timeout": 30}})
    guard = Safeguards(spec)
    transport = GrpcTransport("127.0.0.1:0", tokens=TOKENS,
                              consent=ConsentService(str(db), "p", wall=time.time).handle)
    yield spec, guard, transport, f"127.0.0.1:{transport.port}", db
    transport.close()
    guard.close()


def _dial(addr: str, token: str | None, cid: str = "") -> GrpcClient:
    return GrpcClient(addr, client_id=cid, token=token, properties={"num_examples": 5},
                      connect_timeout=10)


def test_only_the_token_decides_whose_consent_it_is(server):
    _, _, _, addr, db = server
    # a forged claim of another id in the request changes nothing: the record is the token's
    reply = _dial(addr, "tok-a").consent({"action": "grant", "purpose": "p", "version": 2,
                                          "client_id": "b"})
    assert reply == {"client_id": "a", "granted": "p", "version": 2}
    for token in (None, "forged"):
        with pytest.raises(PlinthError, match="UNAUTHENTICATED"):
            _dial(addr, token, cid="b").consent({"action": "grant", "purpose": "p"})
    with pytest.raises(PlinthError, match="INVALID_ARGUMENT.*purpose: this task asks consent"):
        _dial(addr, "tok-b").consent({"action": "grant", "purpose": "ads"})
    with pytest.raises(PlinthError, match="version: must be a whole number"):
        _dial(addr, "tok-b").consent({"action": "grant", "purpose": "p", "version": "2"})
    reg = ConsentRegistry(str(db))
    assert reg.consent_version("a", "p", now=time.time()) == 2
    assert reg.consent_version("b", "p", now=time.time()) is None
    reg.close()
    listed = _dial(addr, "tok-b").consent({"action": "list", "purpose": "p"})
    assert listed["client_id"] == "b" and listed["consents"] == [] and listed["audit"] == []


def test_a_revocation_refuses_the_update_in_flight_and_the_next_draw(server, tmp_path):
    spec, guard, transport, addr, db = server
    for token in TOKENS:
        _dial(addr, token).consent({"action": "grant", "purpose": "p", "version": 1})

    def c_revokes(r: int) -> None:
        if r == 2:  # after it was selected for round 2, before its update arrives
            _dial(addr, "tok-c").consent({"action": "revoke", "purpose": "p"})

    stop = threading.Event()
    workers = []
    for token, cid in TOKENS.items():
        client = _dial(addr, token)
        runner = ClientRunner(_Client(c_revokes if cid == "c" else None))
        workers.append(threading.Thread(target=client.serve, args=(runner.handle, stop),
                                        daemon=True))
        workers[-1].start()
    srv = Server(make_strategy("fedavg"), transport, spec.server, safeguards=guard)
    srv.initialize([np.zeros(4, np.float32)])
    records = srv.run(3)
    stop.set()
    assert [r.clients for r in records] == [["a", "b", "c"], ["a", "b", "c"], ["a", "b"]]
    refused = [f for f in records[1].failures if f["cid"] == "c"]
    assert records[1].updates == 2 and refused and refused[0]["kind"] == "rejected"
    assert "consent" in refused[0]["reason"] and "revoked" in refused[0]["reason"]

    reg = ConsentRegistry(str(db))
    log = reg.audit_log(client_id="c")
    reg.close()
    events = [(e.event, e.round) for e in log]
    assert events[0] == ("granted", None)
    assert ("participated", 1) in events and ("participated", 2) not in events
    assert ("selected", 2) in events and ("excluded", 3) in events
    assert ("selected", 3) not in events
    assert events.index(("revoked", None)) < events.index(("excluded", 3))

    n = export_audit(log, tmp_path / "audit.csv")
    rows = list(csv.DictReader((tmp_path / "audit.csv").open()))
    assert n == len(rows) == len(log) and rows[0]["event"] == "granted"
    export_audit(log, tmp_path / "audit.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines] == [e.event for e in log]
