"""Which clients take part in a round: the eligibility rule and the draw. Pure functions of the
clients, the rule and a seeded `rng`, shared by the server and its safeguards."""

from __future__ import annotations

import math

import numpy as np

from plinth.fl.app import EligibilitySpec
from plinth.fl.messages import ClientInfo


def eligible(clients: list[ClientInfo], rule: EligibilitySpec) -> list[ClientInfo]:
    """Clients that satisfy the eligibility rule (enough examples, required properties)."""
    out = []
    for c in clients:
        if float(c.properties.get("num_examples", rule.min_examples)) < rule.min_examples:
            continue
        if any(c.properties.get(k) != v for k, v in rule.require.items()):
            continue
        out.append(c)
    return out


def select(clients: list[ClientInfo], *, fraction: float, min_clients: int,
           rng: np.random.Generator) -> list[str]:
    """⌈fraction·n⌉ clients (at least `min_clients`, at most n), drawn without replacement."""
    n = len(clients)
    k = min(n, max(min_clients, math.ceil(fraction * n)))
    ids = sorted(c.cid for c in clients)
    return [ids[i] for i in sorted(rng.choice(n, size=k, replace=False))]
