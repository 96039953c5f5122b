"""A malicious server against real SecAgg+ clients over gRPC on 127.0.0.1 (issue 19, finding 6).

The server writes its own setup messages: a threshold of 1 (one neighbour's shares then give
away a client's masks), a neighbourhood too small for the security parameter, and a graph seed
of its choosing. A real client of the app (`AppClients(...).runner`, serving through
`GrpcClient`) must refuse each before it trains or sends a key, and accept the honest setup.
"""

import threading
from pathlib import Path

import numpy as np
import pytest

from plinth.fl import serde
from plinth.fl.app import load_app
from plinth.fl.client import AppClients
from plinth.fl.messages import ErrorRes, SecAggIns, SecAggRes
from plinth.fl.privacy.secagg import SecAggConfig
from plinth.fl.privacy.secagg_round import public_graph_seed, setup_meta
from plinth.fl.rounds import initial_model
from plinth.fl.transport.grpc import GrpcClient, GrpcTransport

TINY = str(Path(__file__).parent / "apps" / "tiny.yaml")
N, ROUND = 16, 3  # 16 clients: the default neighbourhood is 2·log2(16) = 8


@pytest.fixture(scope="module")
def client_over_grpc():
    """Client 0 of a SecAgg+ app, joined to a server the test controls."""
    spec = load_app(TINY, {"privacy": {"secagg": {"threshold": 0.5}}, "data.clients": N})
    transport = GrpcTransport("127.0.0.1:0")
    runner = AppClients(spec, N).runner(0)
    client = GrpcClient(f"127.0.0.1:{transport.port}", client_id="0")
    worker = threading.Thread(target=client.serve, args=(runner.handle,), daemon=True)
    worker.start()
    assert transport.wait_for(1, 30)
    _, params = initial_model(spec)
    yield spec, transport, runner, params
    transport.close()
    worker.join(timeout=10)


def _setup(transport, params, round_id: int, stage: str = "advertise", **cfg) -> object:
    base = {"client_ids": tuple(range(N)), "vector_len": sum(p.size for p in params),
            "round_id": round_id, "graph_seed": public_graph_seed(0, round_id)}
    config = SecAggConfig(**{**base, **cfg})
    payload = serde.encode(SecAggIns(round_id, stage, params, setup_meta(config, 0, {}, None)))
    return serde.decode(transport.submit("0", payload).result(timeout=60))


@pytest.mark.parametrize(("tampered", "why"), [
    ({"threshold_fraction": 0.01}, "threshold 1 of 8 neighbours"),  # t = 1: unmask anyone
    ({"threshold_fraction": 0.49, "degree": 8}, "threshold 4 of 8"),  # half is not enough
    ({"degree": 2}, "2 neighbours each"),  # too small a neighbourhood
    ({"graph_seed": 12345}, "graph_seed 12345 is not the public seed"),  # a chosen graph
])
def test_a_client_refuses_a_setup_that_would_let_the_server_unmask_it(client_over_grpc,
                                                                     tampered, why):
    _, transport, runner, params = client_over_grpc
    reply = _setup(transport, params, ROUND, **tampered)
    assert isinstance(reply, ErrorRes) and why in reply.message and "refused" in reply.message
    assert ROUND not in runner.secagg_sessions  # no keys made, nothing trained or kept


def test_the_honest_setup_is_accepted(client_over_grpc):
    _, transport, runner, params = client_over_grpc
    reply = _setup(transport, params, ROUND + 1)
    assert isinstance(reply, SecAggRes) and reply.stage == "advertise"
    assert len(reply.arrays) >= 1 and ROUND + 1 in runner.secagg_sessions
    keys = np.concatenate([np.asarray(a).ravel() for a in reply.arrays])
    assert keys.size > 0


@pytest.mark.parametrize("old", ["setup", "advertise_keys", "unmasking"])
def test_one_stage_vocabulary_the_old_names_are_refused(client_over_grpc, old):
    """The protocol, the wire and the driver share `Stage`: a setup under one of the three
    old vocabularies' names starts nothing on a real client."""
    from plinth.fl.privacy.secagg_messages import NEXT_STAGE, ROUND_STAGES, STAGE_MESSAGES, Stage

    assert [str(s) for s in ROUND_STAGES] == ["advertise", "share_keys", "masked_input",
                                             "unmask"]
    assert set(STAGE_MESSAGES) == set(ROUND_STAGES[1:]) and NEXT_STAGE[Stage.UNMASK] == "done"
    _, transport, runner, params = client_over_grpc
    reply = _setup(transport, params, ROUND + 7, stage=old)
    assert isinstance(reply, ErrorRes) and "no state for" in reply.message
    assert ROUND + 7 not in runner.secagg_sessions
