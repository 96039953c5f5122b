"""The server's side of a federated task, for `plinth fl sim` and `plinth fl server` alike: the
app's starting model, its central evaluator and safeguards, and `serve_rounds`, the server's
whole life on a transport. The simulation (`sim.py`) hands it a transport of virtual clients;
the deployed server (`deploy.py`, each FLTask's `server` unit) a gRPC one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from plinth.fl.aggregate.leaf_link import LeafRegistry
from plinth.fl.app import AppSpec, load_code
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.data import load_source
from plinth.fl.messages import Metrics, NDArrays
from plinth.fl.robust.rules import RULES
from plinth.fl.safeguards import Safeguards, root_trainer
from plinth.fl.server import RoundRecord, Server
from plinth.fl.strategies import make_strategy


def initial_model(spec: AppSpec) -> tuple[Any, NDArrays]:
    """The app's model, initialised from the app's seed, and its parameters."""
    import torch

    from plinth.fl.torch_client import get_parameters

    code = load_code(spec)
    torch.manual_seed(spec.seed)
    model = code.make_model(spec)
    return model, get_parameters(model)


def central_evaluator(spec: AppSpec, model: Any) -> Callable[[NDArrays], tuple[float, Metrics]]:
    """Test loss and accuracy; with a backdoor attack, also the backdoor's success rate (the
    share of triggered test images, not already of the target class, classified as the target)."""
    import torch

    from plinth.fl.torch_client import evaluate_model, set_parameters

    _, test = load_source(spec.data, spec.seed)
    attack = spec.attack if spec.attack is not None and spec.attack.kind == "backdoor" else None

    def evaluate(params: NDArrays) -> tuple[float, Metrics]:
        set_parameters(model, params)
        loss, acc = evaluate_model(model, test)
        metrics = {"accuracy": acc}
        if attack is not None:
            from plinth.fl.client import trigger_side
            from plinth.fl.robust.attacks import backdoor_success_rate

            @torch.no_grad()
            def predict(x: np.ndarray) -> np.ndarray:
                model.eval()
                return model(torch.from_numpy(x.astype(test.x.dtype))).argmax(1).numpy()

            metrics["backdoor_success"] = backdoor_success_rate(
                predict, test.x, test.y, side=trigger_side(test.x.shape[1]),
                target=attack.target, patch=attack.patch)
        return loss, metrics

    return evaluate


def make_safeguards(spec: AppSpec, *, simulated: bool = False) -> Safeguards:
    """The app's robust rule, DP, SecAgg and consent settings for a server that holds data;
    `simulated` (`plinth fl sim` only) lets `noise: auto` mean seeded noise."""
    robust = spec.strategy.robust
    root = robust is not None and RULES.get(robust.rule).needs_server_update
    update = root_trainer(spec) if root else None
    return Safeguards(spec, server_update=update, simulated=simulated)


def serve_rounds(spec: AppSpec, transport: Any, model: Any, params: NDArrays, *,
                 ckpt: Checkpointer | None, resume: bool,
                 on_round: Callable[[RoundRecord], None] | None,
                 on_start: Callable[[AppSpec, int], None] | None = None,
                 simulated: bool = False, leaves: LeafRegistry | None = None
                 ) -> tuple[Server, list[RoundRecord]]:
    """The server's whole life on a transport: build it with the app's strategy, evaluator and
    safeguards, resume or start, run the rounds, and close the transport, the safeguards, the
    server (its aggregator tree) and the checkpoint whatever happens. `leaves`: where the
    tree's leaf units join (see `Server`)."""
    strategy = make_strategy(spec.strategy.name, spec.strategy.options)
    guard = make_safeguards(spec, simulated=simulated)
    server = None
    try:
        server = Server(strategy, transport, spec.server, seed=spec.seed,
                        evaluate=central_evaluator(spec, model)
                        if spec.server.evaluate == "central" else None, checkpoint=ckpt,
                        safeguards=guard, leaves=leaves)
        server.initialize(params, resume=resume)
        if on_start is not None:
            on_start(spec, server.start_round)
        return server, server.run(spec.server.rounds, on_round)
    finally:
        transport.close()
        guard.close()
        if server is not None:
            server.close()
        if ckpt is not None:
            ckpt.close()
