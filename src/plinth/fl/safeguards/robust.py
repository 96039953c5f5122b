"""The robust-rule round: the app's `strategy.robust` rule, looked up in the rule registry
(`plinth.fl.robust.rules.RULES`), fed the round's collected updates.

The state that spans rounds is the centered-clipping centre (last round's aggregate); FLTrust's
server update comes from `root_trainer`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from plinth.core.errors import SpecError
from plinth.fl.app import AppSpec, RobustSpec
from plinth.fl.messages import NDArrays
from plinth.fl.robust.rules import RULES, RuleInputs
from plinth.fl.safeguards.collecting import Reduce, Reduced, flatten

log = logging.getLogger("plinth.fl.safeguards")

ServerUpdate = Callable[[NDArrays, int], np.ndarray]


class RobustRound:
    """One rule for the whole task, and the centre it keeps between rounds."""

    def __init__(self, spec: RobustSpec, server_update: ServerUpdate | None) -> None:
        self.spec, self.server_update = spec, server_update
        self.rule = RULES.get(spec.rule)
        self.center: np.ndarray | None = None
        if self.rule.needs_server_update and server_update is None:
            raise SpecError("strategy.robust.rule: fltrust needs a server that holds data "
                            "(a root set); this server has none")

    def min_clients(self) -> int:
        return self.rule.min_clients(self.spec)

    def too_few(self, r: int, k: float) -> str | None:
        """Why a round of `k` clients cannot run the rule, or None."""
        need = self.min_clients()
        if k < need:
            return (f"strategy.robust: rule {self.spec.rule} with f={self.spec.f} needs at "
                    f"least {need} clients a round, round {r} selected {k}")
        return None

    def reduce_for(self, r: int, params: NDArrays) -> Reduce:
        def reduce(rows: np.ndarray, weights: np.ndarray) -> Reduced:
            g0 = None
            if self.rule.needs_server_update:
                assert self.server_update is not None
                g0 = self.server_update(params, r)
            try:
                res = self.rule.reduce(self.spec, RuleInputs(rows, weights, self.center, g0))
            except ValueError as e:
                # fewer updates arrived than the rule needs (failures): keep the model
                log.warning("round %d: %s; the model stays", r, e)
                return np.zeros(rows.shape[1]), {"robust_skipped": 1.0}, str(e)
            self.center = res.vector
            return res.vector, {"robust_selected": float(len(res.selected))}, res.reason

        return reduce


def root_trainer(spec: AppSpec) -> ServerUpdate:
    """FLTrust's server update: one local fit from the global model on a small clean root set
    (`strategy.robust.root_examples` examples of the training split, drawn from the seed)."""
    from plinth.fl.app import load_code
    from plinth.fl.data import load_source
    from plinth.fl.torch_client import make_default_client

    assert spec.strategy.robust is not None
    train, _ = load_source(spec.data, spec.seed)
    rng = np.random.default_rng([spec.seed, 0xF17])
    k = min(len(train), spec.strategy.robust.root_examples)
    root = train.subset(np.sort(rng.choice(len(train), size=k, replace=False)))
    model = load_code(spec).make_model(spec)
    client = make_default_client(model, root, None, spec.train, spec.seed + 0xF17)

    def update(params: NDArrays, round: int) -> np.ndarray:
        new, _, _ = client.fit(params, {"round": round})
        return flatten(new) - flatten(params)

    return update
