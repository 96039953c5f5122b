"""The small dictionary of federated-learning messages and aliases.

Every message that crosses a transport is one of the slotted dataclasses below. `serde.py` turns
each into one buffer and back; the array fields travel as raw little-endian bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

NDArray = npt.NDArray[Any]
NDArrays = list[NDArray]
Scalar = bool | int | float | str
Config = dict[str, Scalar]
Metrics = dict[str, float]


@dataclass(slots=True)
class FitIns:
    """Server → client: train from `parameters` (global model version `round`)."""

    round: int
    parameters: NDArrays
    config: Config = field(default_factory=dict)


@dataclass(slots=True)
class FitRes:
    """Client → server: the update (new parameters minus the ones received), maybe compressed.

    `codec` names how `update` is encoded ("" for dense float arrays, see `compress.py`) and
    `codec_meta` carries what the decoder needs (scales, shapes).
    """

    round: int
    update: NDArrays
    num_examples: int
    metrics: Metrics = field(default_factory=dict)
    codec: str = ""
    codec_meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class EvaluateIns:
    round: int
    parameters: NDArrays
    config: Config = field(default_factory=dict)


@dataclass(slots=True)
class EvaluateRes:
    round: int
    loss: float
    num_examples: int
    metrics: Metrics = field(default_factory=dict)


@dataclass(slots=True)
class ErrorRes:
    """Client → server: the client's code raised. The server records it as a failure."""

    round: int
    message: str


@dataclass(slots=True)
class SecAggIns:
    """Server → client: one stage of a SecAgg+ round (`plinth.fl.privacy.secagg_round`).

    Stage "advertise" (`plinth.fl.privacy.secagg.Stage`, the one vocabulary) carries the model in `arrays` and, in `meta`, the fit config and the round's
    public SecAgg+ parameters: the client trains, encodes its update and advertises its keys.
    The later stages ("share_keys", "masked_input", "unmask") carry the protocol's server
    message, its scalar fields in `meta` and its ids, keys and ciphertexts as numeric arrays.
    """

    round: int
    stage: str
    arrays: NDArrays
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SecAggRes:
    """Client → server: its SecAgg+ message for the stage its request named."""

    round: int
    stage: str
    arrays: NDArrays
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Failure:
    """A client that did not contribute to a round, and why. Strategies receive these as data."""

    cid: str
    round: int
    kind: str  # "timeout" | "error" | "rejected" | "lost"
    reason: str


@dataclass(slots=True)
class ClientInfo:
    """What the server knows about a client when it selects participants."""

    cid: str
    properties: dict[str, Scalar] = field(default_factory=dict)


def model_bytes(arrays: NDArrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays))
