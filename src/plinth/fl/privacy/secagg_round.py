"""SecAgg+ as messages on the FL transport: the server's stage driver and a client's round state.

A round is four request/reply exchanges between the server and each chosen client, all as
`SecAggIns` / `SecAggRes` buffers (`plinth.fl.serde`):

=============  ==========================================  ======================================
stage          server → client                             client → server
=============  ==========================================  ======================================
setup          the model, fit config, SecAgg+ parameters   ``advertise``: its two public keys
share_keys     its neighbours' public keys                 encrypted Shamir shares, commitment
masked_input   the shares its neighbours sent it           its masked, fixed-point update
unmask         which neighbours survived, which dropped    seed shares / mask-key shares
=============  ==========================================  ======================================

On setup the client trains, takes its delta, clips it (and with distributed DP adds its noise
share) and keeps the vector with its `ClientSecAgg` until unmask. The server side is
`ServerRound`: it turns replies into `ServerSecAgg.receive` calls and each stage's close into the
next stage's requests, so the server process only ever holds public keys, ciphertexts, masked
vectors and the unmasked sum. Neither class does I/O: the server (`plinth.fl.server`) sends the
requests and applies the straggler timeout per stage; a client that misses a stage is a dropout.

SecAgg ids are positions 0..n-1 in the round's sorted client list; a reply must come from the
transport client that owns its position, so one client cannot answer for another.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl import serde
from plinth.fl.messages import ErrorRes, NDArrays, SecAggIns, SecAggRes
from plinth.fl.privacy.masking import default_degree, dequantize
from plinth.fl.privacy.secagg import (
    ClientSecAgg,
    SecAggConfig,
    SecAggError,
    SecAggResult,
    ServerSecAgg,
)
from plinth.fl.privacy.secagg_messages import (
    NEXT_STAGE,
    STAGE_MESSAGES,
    AdvertiseKeys,
    Stage,
    WireError,
    from_arrays,
    to_arrays,
)

log = logging.getLogger("plinth.fl.privacy.secagg_round")

SETUP = Stage.ADVERTISE  # the wire's first stage: the model, the parameters; keys come back
_CONFIG_FIELDS = ("vector_len", "round_id", "clip", "scale", "full_graph", "degree",
                  "threshold_fraction", "graph_seed", "min_survivors")


@dataclass(frozen=True, slots=True)
class DistributedDP:
    """Each client adds N(0, (z·C)²/m) to its clipped update before masking (see dp.py)."""

    clip: float
    noise_multiplier: float
    min_honest_clients: int


def noisy_vector(vec: np.ndarray, dp: DistributedDP | None, noise: Any) -> np.ndarray:
    """What a client feeds into SecAgg: its flat update, or with distributed DP its update
    clipped to L2 norm C plus its noise share (`distributed_noise_share`)."""
    if dp is None:
        return np.asarray(vec, dtype=np.float64)
    from plinth.fl.privacy.dp import distributed_noise_share

    return distributed_noise_share(vec, clip_norm=dp.clip, noise_multiplier=dp.noise_multiplier,
                                   min_honest_clients=dp.min_honest_clients, noise=noise)


def setup_meta(config: SecAggConfig, index: int, fit_config: dict[str, Any],
               dp: DistributedDP | None) -> dict[str, Any]:
    secagg = {k: getattr(config, k) for k in _CONFIG_FIELDS}
    dp_meta = None if dp is None else {"clip": dp.clip, "noise_multiplier": dp.noise_multiplier,
                                       "min_honest_clients": dp.min_honest_clients}
    return {"config": fit_config, "secagg": {**secagg, "n": len(config.client_ids),
                                             "index": index}, "dp": dp_meta}


def setup_from_meta(meta: dict[str, Any]) -> tuple[SecAggConfig, int, DistributedDP | None,
                                                  dict[str, Any]]:
    """(config, this client's SecAgg id, distributed DP, fit config) from a setup message."""
    try:
        s, dp = dict(meta["secagg"]), meta.get("dp")
        cfg = SecAggConfig(client_ids=tuple(range(int(s["n"]))),
                           **{k: s[k] for k in _CONFIG_FIELDS})
        index = int(s["index"])
        ddp = None if dp is None else DistributedDP(float(dp["clip"]),
                                                    float(dp["noise_multiplier"]),
                                                    int(dp["min_honest_clients"]))
        return cfg, index, ddp, dict(meta.get("config") or {})
    except (KeyError, TypeError, ValueError) as e:
        raise SecAggError(f"setup: bad SecAgg+ parameters ({type(e).__name__}: {e})") from None


def public_graph_seed(app_seed: int, round_id: int) -> int:
    """The neighbour graph's seed for a round: from the app's seed, which every client holds,
    so a client can check that the server did not pick a graph of its own."""
    return app_seed * 1_000_003 + round_id


@dataclass(frozen=True, slots=True)
class SetupPolicy:
    """What a client accepts in a setup message, from its own copy of the app spec
    (`privacy.secagg` and `seed`); see `check_setup`."""

    app_seed: int | None = None  # None: the graph seed is not checked
    degree: int | None = None  # the app's `neighbours` (None: about 2·log2 n)
    full_graph: bool = False
    threshold_fraction: float = 0.5


def check_setup(cfg: SecAggConfig, policy: SetupPolicy) -> None:
    """Refuse (`SecAggError`) a setup whose parameters would let the server unmask one client:

    - a threshold t that is not more than half of the neighbourhood k (or below the app's own
      threshold): then the server can ask one set of neighbours for a client's self-mask seed
      and another set for its mask key, and take its update out of the sum;
    - a neighbourhood smaller than the app asks for (by default about 2·log2 n, SecAgg+'s
      security parameter), or not the full graph when the app says full_graph;
    - a graph seed other than the public one derived from the app's seed, so that the server
      cannot search for a graph that surrounds a victim with clients it controls.
    """
    n = len(cfg.client_ids)
    graph = cfg.graph()
    k = min(len(v) for v in graph.values())
    t = cfg.threshold(graph)
    want_k = n - 1 if policy.full_graph else min(n - 1, policy.degree or default_degree(n))
    want_t = max(k // 2 + 1, int(policy.threshold_fraction * k) + 1)
    if k < want_k:
        raise SecAggError(f"setup: refused: {k} neighbours each, the app asks for at least "
                          f"{want_k} of the {n} clients")
    if t < want_t:
        raise SecAggError(f"setup: refused: threshold {t} of {k} neighbours, need at least "
                          f"{want_t} (more than half, and the app's threshold)")
    if policy.app_seed is not None and not cfg.full_graph \
            and cfg.graph_seed != public_graph_seed(policy.app_seed, cfg.round_id):
        raise SecAggError(f"setup: refused: graph_seed {cfg.graph_seed} is not the public seed "
                          f"of round {cfg.round_id}")


# ---- client ---------------------------------------------------------------------------------


class ClientRound:
    """One client's SecAgg+ state for one round, from setup to unmask."""

    def __init__(self, config: SecAggConfig, index: int, vector: np.ndarray, *,
                 random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        if vector.shape != (config.vector_len,):
            raise SecAggError(f"setup: the update has {vector.size} values, the round expects "
                              f"vector_len={config.vector_len}")
        self.secagg = ClientSecAgg(index, config, random_bytes=random_bytes)
        self.vector = vector
        self.next: Stage = Stage.SHARE_KEYS

    def advertise(self) -> SecAggRes:
        return self._res(Stage.ADVERTISE, self.secagg.advertise())

    def answer(self, ins: SecAggIns) -> SecAggRes:
        """The reply to one stage message. A message for another round or out of turn (a replay)
        is refused without touching the round's state; `SecAggError` says why."""
        cfg = self.secagg.config
        if ins.round != cfg.round_id or ins.stage != self.next:
            raise self._refuse(f"{ins.stage} for round {ins.round} while waiting for "
                               f"{self.next} of round {cfg.round_id} (replayed or out of turn)")
        try:
            msg = from_arrays(STAGE_MESSAGES[ins.stage][0], ins.meta, list(ins.arrays))
        except WireError as e:
            raise self._refuse(str(e)) from None
        if ins.stage == Stage.SHARE_KEYS:
            out = self.secagg.share_keys(msg)  # type: ignore[arg-type]
        elif ins.stage == Stage.MASKED_INPUT:
            out = self.secagg.masked_input(msg, self.vector)  # type: ignore[arg-type]
            self.vector = np.empty(0)  # the plaintext is no longer needed
        else:
            out = self.secagg.unmask(msg)  # type: ignore[arg-type]
        self.next = NEXT_STAGE[self.next]
        return self._res(ins.stage, out)

    def _refuse(self, why: str) -> SecAggError:
        log.warning("client %d refuses: %s", self.secagg.id, why)
        return SecAggError(why)

    def _res(self, stage: str, msg: Any) -> SecAggRes:
        meta, arrays = to_arrays(msg)
        return SecAggRes(self.secagg.config.round_id, stage, arrays, meta)


# ---- server ---------------------------------------------------------------------------------


class ServerRound:
    """The server's side of one round: requests out, replies in, one stage at a time."""

    def __init__(self, config: SecAggConfig, cids: list[str]) -> None:
        if len(cids) != len(config.client_ids):
            raise ValueError(f"{len(cids)} clients for a SecAgg config of "
                             f"{len(config.client_ids)}")
        self.config = config
        self.cids = sorted(cids)
        self.index = {c: i for i, c in enumerate(self.cids)}
        self.secagg = ServerSecAgg(config)
        self.stage: Stage = SETUP  # the stage whose replies are awaited
        self.result: SecAggResult | None = None
        self.alive = set(self.cids)  # clients whose every reply so far was accepted
        self._accepted: set[str] = set()

    def setup(self, parameters: NDArrays, fit_config: dict[str, Any],
              dp: DistributedDP | None) -> dict[str, bytearray]:
        return {c: serde.encode(SecAggIns(self.config.round_id, SETUP, parameters,
                                          setup_meta(self.config, i, fit_config, dp)))
                for c, i in self.index.items()}

    def receive(self, cid: str, payload: bytes | bytearray) -> tuple[str, str] | None:
        """Take one client's reply to the current stage; None when it is accepted, else the
        failure (kind, reason) — "error" when the client reported one, "rejected" otherwise."""
        try:
            res = serde.decode(payload, expect=SecAggRes)
        except PlinthError as e:
            return self._rejected(cid, str(e))
        if isinstance(res, ErrorRes):
            return "error", res.message
        want = self.stage
        if res.round != self.config.round_id or res.stage != want:
            return self._rejected(cid, f"{res.stage} reply for round {res.round}, expected "
                                       f"{want} of round {self.config.round_id} "
                                       f"(replayed or stale)")
        cls = AdvertiseKeys if self.stage == SETUP else STAGE_MESSAGES[self.stage][1]
        try:
            msg = from_arrays(cls, res.meta, list(res.arrays))
        except WireError as e:
            return self._rejected(cid, str(e))
        if msg.sender != self.index.get(cid):  # type: ignore[union-attr]
            return self._rejected(cid, f"claims SecAgg id {msg.sender}, "  # type: ignore[union-attr]
                                       f"its id is {self.index.get(cid)}")
        if not self.secagg.receive(msg):  # logged and kept in self.secagg.rejections
            return "rejected", self.secagg.rejections[-1].reason
        self._accepted.add(cid)
        return None

    def _rejected(self, cid: str, why: str) -> tuple[str, str]:
        log.warning("secagg round %d: reply from client %s rejected in %s: %s",
                    self.config.round_id, cid, self.stage, why)
        return "rejected", why

    def advance(self) -> dict[str, bytearray]:
        """Close the current stage; the next stage's requests, or {} once the sum is out.
        Raises `SecAggAbort` (nothing revealed) when too few clients are left."""
        s = self.secagg
        self.alive &= self._accepted
        self._accepted = set()
        if self.stage == SETUP:
            out: dict[int, Any] = s.close_advertise()
        elif self.stage == Stage.SHARE_KEYS:
            out = s.close_share_keys()
        elif self.stage == Stage.MASKED_INPUT:
            out = s.close_masked_input()
        else:
            self.result = s.close_unmask()
            self.stage = Stage.DONE
            return {}
        self.stage = NEXT_STAGE[self.stage]
        reqs = {}
        for i, msg in out.items():
            meta, arrays = to_arrays(msg)
            reqs[self.cids[i]] = serde.encode(SecAggIns(self.config.round_id, self.stage,
                                                        arrays, meta))
        return reqs

    def total(self) -> np.ndarray:
        """The decoded float sum of the survivors' (clipped, fixed-point) vectors."""
        if self.result is None:
            raise SecAggError("the round has no sum (not finished, or aborted)")
        return dequantize(self.result.total, scale=self.config.scale)
