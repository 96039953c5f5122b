"""SecAgg+ (Bell et al., CCS 2020) on SecAgg (Bonawitz et al., CCS 2017) as message-passing state machines.

Four rounds, each closed by the server when it stops waiting (the transport decides when):

0. advertise keys  client -> server ``AdvertiseKeys`` (two X25519 public keys);
                   server -> client ``KeyDirectory`` (the keys of its live neighbours).
1. share keys      client -> server ``ShareKeys``: a hash commitment to its self-mask seed ``b``
                   and, per neighbour, AEAD-encrypted Shamir shares of ``b`` and of its mask
                   private key; server -> client ``ForwardedShares``.
2. masked input    client -> server ``MaskedInput``:
                   y_i = q(x_i) + PRG(b_i) + sum_j sign(i, j) PRG(s_ij)  (mod 2^32),
                   sign +1 when i < j, -1 otherwise, over the neighbours j that shared keys.
3. unmasking       server -> client ``UnmaskRequest`` (which neighbours survived, which dropped);
                   client -> server ``UnmaskResponse``: b-shares of survivors, key shares of the
                   dropped, never both for one client. The server rebuilds the masks and outputs
                   the sum of the survivors' inputs.

Neighbourhoods are a seeded random k-regular graph with k ~ 2 log2 n (SecAgg+); ``full_graph``
gives the original SecAgg. Threshold t = floor(threshold_fraction * k) + 1 per neighbourhood.

Model: semi-honest (honest-but-curious) server and clients, an authenticated channel per client.
The server never sees a single client's unmasked input: a round that cannot be unmasked safely
aborts before any share is requested, and an aborted server drops the masked inputs it holds.
See docs/fl_privacy.md for what this does not protect against.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from plinth.fl.privacy import shamir
from plinth.fl.privacy.masking import (
    check_encoding,
    derive_key,
    expand_mask,
    neighbour_graph,
    pair_info,
    quantize,
    self_info,
    share_info,
)
from plinth.fl.privacy.secagg_messages import (
    CIPHERTEXT_LEN,
    NEXT_STAGE,
    PLAIN_LEN,
    ROUND_STAGES,
    AdvertiseKeys,
    ForwardedShares,
    KeyDirectory,
    MaskedInput,
    ShareKeys,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
)

log = logging.getLogger("plinth.fl.privacy.secagg")

_PLAIN_LEN = PLAIN_LEN


class SecAggError(RuntimeError):
    """A message this party refuses to act on (the reason says why)."""


class SecAggAbort(RuntimeError):
    """The round cannot finish without risking a single client's input; nothing was revealed."""


_TRANSITIONS = {
    *NEXT_STAGE.items(),
    *((s, Stage.ABORTED) for s in ROUND_STAGES),
}


@dataclass(frozen=True, slots=True)
class SecAggConfig:
    """One round's public parameters; every party must hold the same config."""

    client_ids: tuple[int, ...]
    vector_len: int
    round_id: int = 0
    clip: float = 1.0  # coordinate clip before encoding (see masking.quantize)
    scale: float = float(1 << 16)  # fixed-point scale
    full_graph: bool = False  # True: original SecAgg (every pair masks)
    degree: int | None = None  # None: SecAgg+ default ~2 log2 n
    threshold_fraction: float = 0.5
    graph_seed: int = 0
    min_survivors: int = 2  # never output a sum of fewer inputs than this

    def __post_init__(self) -> None:
        ids = self.client_ids
        if len(set(ids)) != len(ids) or any(c < 0 for c in ids):
            raise ValueError(f"client_ids must be distinct non-negative ints, got {ids[:10]}...")
        if len(ids) < 3:
            raise ValueError(f"secure aggregation needs at least 3 clients, got {len(ids)}")
        if self.vector_len <= 0:
            raise ValueError(f"vector_len must be positive, got {self.vector_len}")
        if not 0 < self.threshold_fraction < 1:
            raise ValueError(f"threshold_fraction must be in (0, 1), got {self.threshold_fraction}")
        if self.min_survivors < 2:
            raise ValueError(f"min_survivors must be >= 2, got {self.min_survivors}")
        check_encoding(num_clients=len(ids), clip=self.clip, scale=self.scale)

    def graph(self) -> dict[int, tuple[int, ...]]:
        return neighbour_graph(
            tuple(self.client_ids),
            degree=self.degree,
            full_graph=self.full_graph,
            seed=self.graph_seed,
        )

    def threshold(self, graph: dict[int, tuple[int, ...]]) -> int:
        k = min(len(v) for v in graph.values())
        return int(self.threshold_fraction * k) + 1


def _pk_bytes(pk: X25519PublicKey) -> bytes:
    return pk.public_bytes_raw()


def _aead(
    round_id: int, me: int, peer: int, my_sk: X25519PrivateKey, peer_pk: bytes
) -> ChaCha20Poly1305:
    shared = my_sk.exchange(X25519PublicKey.from_public_bytes(peer_pk))
    return ChaCha20Poly1305(derive_key(shared, info=share_info(round_id, me, peer)))


def _nonce(sender: int, recipient: int) -> bytes:
    # Both directions of a pair share one key; distinct nonces per direction keep it safe.
    return sender.to_bytes(6, "big") + recipient.to_bytes(6, "big")


def _aad(round_id: int, sender: int, recipient: int) -> bytes:
    return round_id.to_bytes(8, "big") + sender.to_bytes(8, "big") + recipient.to_bytes(8, "big")


def pair_sign(me: int, peer: int) -> int:
    """The lower id adds the pair mask, the higher id subtracts it."""
    return 1 if me < peer else -1


# ---- client ---------------------------------------------------------------------------------


class ClientSecAgg:
    """One client's side of a round. Call the four methods in order; each returns the reply."""

    def __init__(
        self,
        client_id: int,
        config: SecAggConfig,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        if client_id not in config.client_ids:
            raise ValueError(f"client {client_id} is not in this round's client_ids")
        self.id = client_id
        self.config = config
        self._rand = random_bytes
        self._graph = config.graph()
        self._t = config.threshold(self._graph)
        self._enc_sk = X25519PrivateKey.from_private_bytes(random_bytes(32))
        self._mask_sk = X25519PrivateKey.from_private_bytes(random_bytes(32))
        self._seed = random_bytes(32)
        self._stage = Stage.ADVERTISE
        self._dir: dict[int, tuple[bytes, bytes]] = {}
        self._held: dict[int, tuple[int, int]] = {}  # sender -> (seed share, key share)
        self._paired: tuple[int, ...] = ()
        self.invalid_shares: list[tuple[int, str]] = []

    def _refuse(self, reason: str) -> SecAggError:
        log.warning("client %d refuses: %s", self.id, reason)
        self._stage = Stage.ABORTED
        return SecAggError(reason)

    def _expect(self, stage: Stage, msg: KeyDirectory | ForwardedShares | UnmaskRequest) -> None:
        if self._stage is not stage:
            raise self._refuse(f"{type(msg).__name__} arrived in stage {self._stage.value}")
        if msg.round_id != self.config.round_id or msg.recipient != self.id:
            raise self._refuse(
                f"{type(msg).__name__} for round {msg.round_id}/client {msg.recipient}, "
                f"expected round {self.config.round_id}/client {self.id} (replayed or misrouted)"
            )

    def advertise(self) -> AdvertiseKeys:
        if self._stage is not Stage.ADVERTISE:
            raise self._refuse("advertise called twice")
        self._stage = Stage.SHARE_KEYS
        return AdvertiseKeys(
            self.config.round_id,
            self.id,
            _pk_bytes(self._enc_sk.public_key()),
            _pk_bytes(self._mask_sk.public_key()),
        )

    def share_keys(self, msg: KeyDirectory) -> ShareKeys:
        self._expect(Stage.SHARE_KEYS, msg)
        nbrs = set(self._graph[self.id])
        if not set(msg.keys) <= nbrs:
            raise self._refuse(f"directory names non-neighbours {sorted(set(msg.keys) - nbrs)[:5]}")
        if len(msg.keys) < self._t:
            raise self._refuse(f"only {len(msg.keys)} live neighbours, threshold is {self._t}")
        if any(len(a) != 32 or len(b) != 32 for a, b in msg.keys.values()):
            raise self._refuse("directory holds a public key that is not 32 bytes")
        self._dir = dict(msg.keys)
        holders = sorted(self._dir)
        xs = [h + 1 for h in holders]
        seed_sh = shamir.split(self._seed, threshold=self._t, xs=xs, random_bytes=self._rand)
        key_sh = shamir.split(
            self._mask_sk.private_bytes_raw(), threshold=self._t, xs=xs, random_bytes=self._rand
        )
        rid = self.config.round_id
        cts = {}
        for h in holders:
            plain = (
                self.id.to_bytes(8, "big")
                + h.to_bytes(8, "big")
                + seed_sh[h + 1].to_bytes(shamir.SHARE_BYTES, "big")
                + key_sh[h + 1].to_bytes(shamir.SHARE_BYTES, "big")
            )
            aead = _aead(rid, self.id, h, self._enc_sk, self._dir[h][0])
            cts[h] = aead.encrypt(_nonce(self.id, h), plain, _aad(rid, self.id, h))
        self._stage = Stage.MASKED_INPUT
        return ShareKeys(rid, self.id, hashlib.sha256(self._seed).digest(), cts)

    def masked_input(
        self, msg: ForwardedShares, update: np.ndarray, *, rng: np.random.Generator | None = None
    ) -> MaskedInput:
        """Encode ``update`` (floats, see masking.quantize) and mask it."""
        self._expect(Stage.MASKED_INPUT, msg)
        cfg = self.config
        if not set(msg.ciphertexts) <= set(self._dir):
            raise self._refuse(
                f"shares from non-neighbours {sorted(set(msg.ciphertexts) - set(self._dir))[:5]}"
            )
        if len(msg.ciphertexts) < self._t:
            raise self._refuse(
                f"only {len(msg.ciphertexts)} neighbours shared keys, threshold is {self._t}"
            )
        vec = np.asarray(update)
        if vec.shape != (cfg.vector_len,):
            raise self._refuse(f"update shape {vec.shape} != ({cfg.vector_len},)")
        for sender, ct in sorted(msg.ciphertexts.items()):
            try:
                aead = _aead(cfg.round_id, self.id, sender, self._enc_sk, self._dir[sender][0])
                plain = aead.decrypt(
                    _nonce(sender, self.id), ct, _aad(cfg.round_id, sender, self.id)
                )
                if (
                    len(plain) != _PLAIN_LEN
                    or int.from_bytes(plain[:8], "big") != sender
                    or int.from_bytes(plain[8:16], "big") != self.id
                ):
                    raise ValueError("share header does not name this pair")
                b = 16 + shamir.SHARE_BYTES
                self._held[sender] = (
                    int.from_bytes(plain[16:b], "big"),
                    int.from_bytes(plain[b:], "big"),
                )
            except (InvalidTag, ValueError) as exc:
                reason = "authentication failed" if isinstance(exc, InvalidTag) else str(exc)
                log.warning("client %d rejected share from %d: %s", self.id, sender, reason)
                self.invalid_shares.append((sender, reason))
        # Pair with every neighbour that shared keys, valid ciphertext or not, so masks stay symmetric.
        self._paired = tuple(sorted(msg.ciphertexts))
        total = quantize(vec, clip=cfg.clip, scale=cfg.scale, rng=rng)
        total += expand_mask(
            derive_key(self._seed, info=self_info(cfg.round_id, self.id)), cfg.vector_len
        )
        for peer in self._paired:
            shared = self._mask_sk.exchange(X25519PublicKey.from_public_bytes(self._dir[peer][1]))
            mask = expand_mask(
                derive_key(shared, info=pair_info(cfg.round_id, self.id, peer)), cfg.vector_len
            )
            if pair_sign(self.id, peer) > 0:
                total += mask
            else:
                total -= mask
        self._stage = Stage.UNMASK
        return MaskedInput(cfg.round_id, self.id, total)

    def unmask(self, msg: UnmaskRequest) -> UnmaskResponse:
        self._expect(Stage.UNMASK, msg)
        paired = set(self._paired)
        if msg.survivors & msg.dropped:
            raise self._refuse(
                f"clients listed as both survived and dropped: {sorted(msg.survivors & msg.dropped)[:5]}"
            )
        if (msg.survivors | msg.dropped) != paired:
            raise self._refuse(
                "survivor/dropped lists do not match the neighbours that shared keys"
            )
        if msg.num_survivors < max(self.config.min_survivors, len(msg.survivors) + 1):
            raise self._refuse(
                f"only {msg.num_survivors} survivors; min_survivors is {self.config.min_survivors}"
            )
        seed = {j: self._held[j][0] for j in sorted(msg.survivors) if j in self._held}
        keys = {j: self._held[j][1] for j in sorted(msg.dropped) if j in self._held}
        self._stage = Stage.DONE
        return UnmaskResponse(self.config.round_id, self.id, seed, keys)


# ---- server ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Rejection:
    stage: str
    sender: int
    reason: str


@dataclass(slots=True)
class SecAggResult:
    total: np.ndarray  # uint32 sum of the survivors' encoded inputs
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    invalid_shares: list[tuple[int, int]] = field(default_factory=list)  # (owner, holder)


_STAGE_OF = {
    AdvertiseKeys: Stage.ADVERTISE,
    ShareKeys: Stage.SHARE_KEYS,
    MaskedInput: Stage.MASKED_INPUT,
    UnmaskResponse: Stage.UNMASK,
}


class ServerSecAgg:
    """The server's side: ``receive`` every client message, then ``close_*`` each round in order."""

    def __init__(self, config: SecAggConfig) -> None:
        self.config = config
        self.stage = Stage.ADVERTISE
        self.graph = config.graph()
        self.threshold = config.threshold(self.graph)
        self.rejections: list[Rejection] = []
        self.abort_reason: str | None = None
        self.result: SecAggResult | None = None
        self._inbox: dict[Stage, dict[int, object]] = {s: {} for s in _STAGE_OF.values()}
        self._keys: dict[int, tuple[bytes, bytes]] = {}
        self._dirs: dict[int, tuple[int, ...]] = {}  # client -> live neighbours it was told about
        self._u1: set[int] = set()
        self._commit: dict[int, bytes] = {}
        self._paired: dict[int, tuple[int, ...]] = {}  # client -> neighbours it masks with
        self._u2: set[int] = set()
        self._dropped: set[int] = set()

    # state machine
    def _go(self, to: Stage) -> None:
        if (self.stage, to) not in _TRANSITIONS:
            raise SecAggError(f"illegal transition {self.stage.value} -> {to.value}")
        self.stage = to

    def _abort(self, reason: str) -> SecAggAbort:
        log.error("secagg round %d aborted: %s", self.config.round_id, reason)
        self.abort_reason = reason
        self._inbox = {s: {} for s in self._inbox}  # drop masked inputs: an abort reveals nothing
        if self.stage not in (Stage.DONE, Stage.ABORTED):
            self._go(Stage.ABORTED)
        return SecAggAbort(reason)

    def _reject(self, sender: int, reason: str) -> bool:
        log.warning(
            "secagg rejected message from client %s in %s: %s", sender, self.stage.value, reason
        )
        self.rejections.append(Rejection(self.stage.value, sender, reason))
        return False

    def receive(self, msg: object) -> bool:
        """Check and store one client message; return False (and log why) when it is rejected."""
        stage = _STAGE_OF.get(type(msg))
        sender = getattr(msg, "sender", -1)
        if stage is None:
            return self._reject(sender, f"unknown message type {type(msg).__name__}")
        if msg.round_id != self.config.round_id:
            return self._reject(
                sender, f"round_id {msg.round_id} != {self.config.round_id} (replayed or stale)"
            )
        if sender not in self.graph:
            return self._reject(sender, f"sender {sender} is not a client of this round")
        if stage is not self.stage:
            return self._reject(sender, f"{type(msg).__name__} arrives in stage {self.stage.value}")
        if sender in self._inbox[stage]:
            return self._reject(sender, f"duplicate {type(msg).__name__} (replay)")
        problem = self._validate(msg)
        if problem:
            return self._reject(sender, problem)
        self._inbox[stage][sender] = msg
        return True

    def _validate(self, msg: object) -> str | None:
        if isinstance(msg, AdvertiseKeys):
            if (
                not isinstance(msg.enc_pk, bytes)
                or not isinstance(msg.mask_pk, bytes)
                or len(msg.enc_pk) != 32
                or len(msg.mask_pk) != 32
            ):
                return "public keys must be 32 bytes each"
            if msg.enc_pk == msg.mask_pk:
                return "encryption and mask keys must differ"
        elif isinstance(msg, ShareKeys):
            if msg.sender not in self._dirs:
                return "sender was not in the key directory"
            if len(msg.seed_commitment) != 32:
                return "seed commitment must be 32 bytes"
            if set(msg.ciphertexts) != set(self._dirs[msg.sender]):
                return "ciphertext recipients differ from the neighbours in its directory"
            if any(
                not isinstance(c, bytes) or len(c) != CIPHERTEXT_LEN
                for c in msg.ciphertexts.values()
            ):
                return f"a share ciphertext is not {CIPHERTEXT_LEN} bytes"
        elif isinstance(msg, MaskedInput):
            if msg.sender not in self._u1:
                return "sender did not share keys"
            v = msg.vector
            if (
                not isinstance(v, np.ndarray)
                or v.dtype != np.uint32
                or v.shape != (self.config.vector_len,)
            ):
                return f"masked input must be uint32 of shape ({self.config.vector_len},)"
        elif isinstance(msg, UnmaskResponse):
            if msg.sender not in self._u2:
                return "sender sent no masked input"
            nb = set(self._paired.get(msg.sender, ()))
            if not set(msg.seed_shares) <= (nb & self._u2) or not set(msg.key_shares) <= (
                nb & self._dropped
            ):
                return "shares for clients it was not asked about"
            if any(
                not 0 <= y < shamir.PRIME
                for y in (*msg.seed_shares.values(), *msg.key_shares.values())
            ):
                return "share value outside the field"
        return None

    # round closers
    def close_advertise(self) -> dict[int, KeyDirectory]:
        self._go(Stage.SHARE_KEYS)
        got = self._inbox[Stage.ADVERTISE]
        self._keys = {c: (m.enc_pk, m.mask_pk) for c, m in got.items()}
        # A client whose secrets could never be recovered is left out, and so are its keys.
        self._dirs = self._prune({c: self.graph[c] for c in got})
        if len(self._dirs) < self.config.min_survivors:
            raise self._abort(
                f"only {len(self._dirs)} clients can take part; min_survivors is {self.config.min_survivors}"
            )
        return {
            c: KeyDirectory(self.config.round_id, c, {n: self._keys[n] for n in nb})
            for c, nb in self._dirs.items()
        }

    def close_share_keys(self) -> dict[int, ForwardedShares]:
        self._go(Stage.MASKED_INPUT)
        got = self._inbox[Stage.SHARE_KEYS]
        # Only clients with enough key-sharing neighbours go on; pairs stay symmetric.
        paired = self._prune({c: self._dirs[c] for c in got})
        u1 = set(paired)
        out = {
            c: ForwardedShares(self.config.round_id, c, {s: got[s].ciphertexts[c] for s in nb})
            for c, nb in paired.items()
        }
        self._u1 = u1
        self._paired = {c: tuple(sorted(m.ciphertexts)) for c, m in out.items()}
        self._commit = {c: got[c].seed_commitment for c in u1}
        if len(u1) < self.config.min_survivors:
            raise self._abort(
                f"only {len(u1)} clients shared keys; min_survivors is {self.config.min_survivors}"
            )
        return out

    def close_masked_input(self) -> dict[int, UnmaskRequest]:
        self._go(Stage.UNMASK)
        u2 = set(self._inbox[Stage.MASKED_INPUT])
        self._u2 = u2
        self._dropped = self._u1 - u2
        if len(u2) < self.config.min_survivors:
            raise self._abort(
                f"only {len(u2)} masked inputs arrived; min_survivors is {self.config.min_survivors}"
            )
        for j in sorted(self._u1):
            holders = len(set(self._paired[j]) & u2)
            if holders < self.threshold:
                raise self._abort(
                    f"client {j} has {holders} surviving neighbours, threshold {self.threshold}: "
                    "its mask could not be removed"
                )
        return {
            c: UnmaskRequest(
                self.config.round_id,
                c,
                frozenset(n for n in self._paired[c] if n in u2),
                frozenset(n for n in self._paired[c] if n in self._dropped),
                len(u2),
            )
            for c in sorted(u2)
        }

    def close_unmask(self) -> SecAggResult:
        cfg = self.config
        resp: dict[int, UnmaskResponse] = self._inbox[Stage.UNMASK]
        invalid: list[tuple[int, int]] = []
        total = np.zeros(cfg.vector_len, dtype=np.uint32)
        for c in sorted(self._u2):
            total += self._inbox[Stage.MASKED_INPUT][c].vector
        for j in sorted(self._u1):
            alive = j in self._u2
            shares = {
                h + 1: (r.seed_shares if alive else r.key_shares)[j]
                for h, r in resp.items()
                if j in (r.seed_shares if alive else r.key_shares)
            }
            if len(shares) < self.threshold:
                raise self._abort(
                    f"only {len(shares)} shares for client {j}, threshold {self.threshold}"
                )
            verify = self._seed_check(j) if alive else self._key_check(j)
            try:
                secret, bad = shamir.combine_verified(
                    shares, threshold=self.threshold, verify=verify
                )
            except shamir.ShamirError as exc:
                raise self._abort(
                    f"cannot recover client {j}'s {'seed' if alive else 'key'}: {exc}"
                ) from None
            for x in bad:
                self._reject(x - 1, f"invalid share for client {j}")
                invalid.append((j, x - 1))
            if alive:
                seed = secret.to_bytes(32, "big")
                total -= expand_mask(
                    derive_key(seed, info=self_info(cfg.round_id, j)), cfg.vector_len
                )
            else:
                sk = X25519PrivateKey.from_private_bytes(secret.to_bytes(32, "big"))
                for i in self._paired[j]:
                    if i not in self._u2:
                        continue
                    shared = sk.exchange(X25519PublicKey.from_public_bytes(self._keys[i][1]))
                    mask = expand_mask(
                        derive_key(shared, info=pair_info(cfg.round_id, i, j)), cfg.vector_len
                    )
                    # Survivor i added pair_sign(i, j) * mask; take it back out.
                    if pair_sign(i, j) > 0:
                        total -= mask
                    else:
                        total += mask
        self._go(Stage.DONE)
        self.result = SecAggResult(
            total, tuple(sorted(self._u2)), tuple(sorted(self._dropped)), invalid
        )
        return self.result

    def _prune(self, cand: dict[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
        """Drop clients with fewer than threshold live neighbours until none is left to drop."""
        live = set(cand)
        while True:
            keep = {c for c in live if sum(n in live for n in cand[c]) >= self.threshold}
            if keep == live:
                return {c: tuple(n for n in cand[c] if n in live) for c in sorted(live)}
            live = keep

    def _seed_check(self, j: int) -> Callable[[int], bool]:
        want = self._commit[j]
        return lambda s: s < (1 << 256) and hashlib.sha256(s.to_bytes(32, "big")).digest() == want

    def _key_check(self, j: int) -> Callable[[int], bool]:
        want = self._keys[j][1]

        def ok(s: int) -> bool:
            if s >= (1 << 256):
                return False
            pk = X25519PrivateKey.from_private_bytes(s.to_bytes(32, "big")).public_key()
            return pk.public_bytes_raw() == want

        return ok
