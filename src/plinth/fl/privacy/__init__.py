"""Federated learning privacy: SecAgg+ secure aggregation, differential privacy, consent.

- ``secagg`` / ``secagg_messages`` / ``secagg_driver``: SecAgg+ state machines, wire messages, an in-process round.
- ``secagg_round``: SecAgg+ over the FL transport (the server's stage driver, a client's round state).
- ``shamir``: Shamir secret sharing over a 257-bit prime field.
- ``masking``: fixed-point encoding, HKDF, ChaCha20 mask expansion, neighbour graphs.
- ``dp``: DP-FedAvg, adaptive clipping, local and distributed DP, RDP/PLD accounting and budgets.
- ``consent``: purpose-scoped consent registry with an audit log.
"""

from plinth.fl.privacy.consent import ConsentRegistry
from plinth.fl.privacy.dp import PrivacyAccountant, check_budget, dp_fedavg
from plinth.fl.privacy.secagg import (
    ClientSecAgg,
    SecAggAbort,
    SecAggConfig,
    SecAggError,
    ServerSecAgg,
)
from plinth.fl.privacy.secagg_driver import run_secagg_round

__all__ = [
    "ClientSecAgg",
    "ConsentRegistry",
    "PrivacyAccountant",
    "SecAggAbort",
    "SecAggConfig",
    "SecAggError",
    "ServerSecAgg",
    "check_budget",
    "dp_fedavg",
    "run_secagg_round",
]
