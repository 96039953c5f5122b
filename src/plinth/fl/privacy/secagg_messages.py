"""SecAgg+ wire messages (frozen dataclasses) and their on-the-wire sizes.

Every message carries ``round_id`` (stale or replayed rounds are rejected) and the sender or
recipient id. A transport serialises these; ``wire_size`` gives the bytes a compact fixed-width
encoding needs, which the benchmark reports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from plinth.fl.privacy import shamir


class Stage(enum.StrEnum):
    """The one SecAgg+ stage vocabulary: the protocol's state, the wire's `stage` field
    (`SecAggIns`/`SecAggRes`: a reply carries its request's stage), the driver's drop points."""

    ADVERTISE = "advertise"  # on the wire: the setup (the model, the round's parameters)
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    UNMASK = "unmask"
    DONE = "done"
    ABORTED = "aborted"


ROUND_STAGES = (Stage.ADVERTISE, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK)
NEXT_STAGE = dict(zip(ROUND_STAGES, (*ROUND_STAGES[1:], Stage.DONE)))

PLAIN_LEN = 8 + 8 + 2 * shamir.SHARE_BYTES  # sender, recipient, seed share, key share
CIPHERTEXT_LEN = PLAIN_LEN + 16  # + Poly1305 tag


@dataclass(frozen=True, slots=True)
class AdvertiseKeys:
    round_id: int
    sender: int
    enc_pk: bytes
    mask_pk: bytes


@dataclass(frozen=True, slots=True)
class KeyDirectory:
    round_id: int
    recipient: int
    keys: dict[int, tuple[bytes, bytes]]  # neighbour -> (enc_pk, mask_pk)


@dataclass(frozen=True, slots=True)
class ShareKeys:
    round_id: int
    sender: int
    seed_commitment: bytes  # sha256 of the self-mask seed
    ciphertexts: dict[int, bytes]  # recipient -> AEAD(shares)


@dataclass(frozen=True, slots=True)
class ForwardedShares:
    round_id: int
    recipient: int
    ciphertexts: dict[int, bytes]  # sender -> AEAD(shares)


@dataclass(frozen=True, slots=True)
class MaskedInput:
    round_id: int
    sender: int
    vector: np.ndarray  # uint32, length vector_len


@dataclass(frozen=True, slots=True)
class UnmaskRequest:
    round_id: int
    recipient: int
    survivors: frozenset[int]  # neighbours whose masked input arrived
    dropped: frozenset[int]  # neighbours that shared keys but sent no masked input
    num_survivors: int


@dataclass(frozen=True, slots=True)
class UnmaskResponse:
    round_id: int
    sender: int
    seed_shares: dict[int, int]  # survivor -> share y of its self-mask seed (x = sender + 1)
    key_shares: dict[int, int]  # dropped -> share y of its mask private key


Message = (
    AdvertiseKeys
    | KeyDirectory
    | ShareKeys
    | ForwardedShares
    | MaskedInput
    | UnmaskRequest
    | UnmaskResponse
)


def wire_size(msg: Message) -> int:
    """Bytes the message needs on the wire (fixed-width ids and counts; 4-byte header)."""
    head = 4 + 8 + 8
    if isinstance(msg, AdvertiseKeys):
        return head + 64
    if isinstance(msg, KeyDirectory):
        return head + len(msg.keys) * (8 + 64)
    if isinstance(msg, ShareKeys):
        return head + 32 + len(msg.ciphertexts) * (8 + CIPHERTEXT_LEN)
    if isinstance(msg, ForwardedShares):
        return head + len(msg.ciphertexts) * (8 + CIPHERTEXT_LEN)
    if isinstance(msg, MaskedInput):
        return head + 4 * msg.vector.size
    if isinstance(msg, UnmaskRequest):
        return head + 8 + 8 * (len(msg.survivors) + len(msg.dropped))
    if isinstance(msg, UnmaskResponse):
        return head + (len(msg.seed_shares) + len(msg.key_shares)) * (8 + shamir.SHARE_BYTES)
    raise TypeError(f"not a SecAgg message: {type(msg).__name__}")


# ---- on the FL transport: scalar fields + numeric arrays (plinth.fl.serde) ------------------


class WireError(ValueError):
    """A stage message's arrays do not make the SecAgg+ message its stage names (one line)."""


STAGE_MESSAGES: dict[str, tuple[type, type]] = {  # stage -> (server -> client, client -> server)
    Stage.SHARE_KEYS: (KeyDirectory, ShareKeys),
    Stage.MASKED_INPUT: (ForwardedShares, MaskedInput),
    Stage.UNMASK: (UnmaskRequest, UnmaskResponse),
}


def _ids(keys: object) -> np.ndarray:
    return np.asarray(sorted(keys), dtype=np.int64)  # type: ignore[call-overload]


def _rows(values: list[bytes], width: int) -> np.ndarray:
    if not values:
        return np.zeros((0, width), dtype=np.uint8)
    if any(len(v) != len(values[0]) for v in values):
        raise WireError("byte strings of one message differ in length")
    return np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), -1)


def _shares(shares: dict[int, int]) -> list[np.ndarray]:
    ids = sorted(shares)
    raw = [shares[i].to_bytes(shamir.SHARE_BYTES, "big") for i in ids]
    return [_ids(ids), _rows(raw, shamir.SHARE_BYTES)]


def to_arrays(msg: Message) -> tuple[dict[str, int], list[np.ndarray]]:
    """The message as (scalar fields, arrays): what a `SecAggIns` / `SecAggRes` carries."""
    if isinstance(msg, AdvertiseKeys):
        return {"round_id": msg.round_id, "sender": msg.sender}, [
            np.frombuffer(msg.enc_pk + msg.mask_pk, dtype=np.uint8)]
    if isinstance(msg, KeyDirectory):
        ids = sorted(msg.keys)
        return {"round_id": msg.round_id, "recipient": msg.recipient}, [
            _ids(ids), _rows([msg.keys[i][0] + msg.keys[i][1] for i in ids], 64)]
    if isinstance(msg, ShareKeys):
        ids = sorted(msg.ciphertexts)
        return {"round_id": msg.round_id, "sender": msg.sender}, [
            np.frombuffer(msg.seed_commitment, dtype=np.uint8), _ids(ids),
            _rows([msg.ciphertexts[i] for i in ids], CIPHERTEXT_LEN)]
    if isinstance(msg, ForwardedShares):
        ids = sorted(msg.ciphertexts)
        return {"round_id": msg.round_id, "recipient": msg.recipient}, [
            _ids(ids), _rows([msg.ciphertexts[i] for i in ids], CIPHERTEXT_LEN)]
    if isinstance(msg, MaskedInput):
        return {"round_id": msg.round_id, "sender": msg.sender}, [msg.vector]
    if isinstance(msg, UnmaskRequest):
        return {"round_id": msg.round_id, "recipient": msg.recipient,
                "num_survivors": msg.num_survivors}, [_ids(msg.survivors), _ids(msg.dropped)]
    if isinstance(msg, UnmaskResponse):
        return {"round_id": msg.round_id, "sender": msg.sender}, [
            *_shares(msg.seed_shares), *_shares(msg.key_shares)]
    raise TypeError(f"not a SecAgg message: {type(msg).__name__}")


def from_arrays(cls: type, meta: dict[str, object], arrays: list[np.ndarray]) -> Message:
    """`cls` rebuilt from `to_arrays`' output; `WireError` names what does not fit."""
    name = cls.__name__
    want = {AdvertiseKeys: 1, KeyDirectory: 2, ShareKeys: 3, ForwardedShares: 2,
            MaskedInput: 1, UnmaskRequest: 2, UnmaskResponse: 4}.get(cls)
    if want is None:
        raise TypeError(f"not a SecAgg message: {name}")
    if len(arrays) != want:
        raise WireError(f"{name}: expected {want} arrays, got {len(arrays)}")
    ints = {k: v for k, v in meta.items() if k in ("round_id", "sender", "recipient",
                                                     "num_survivors")}
    if any(not isinstance(v, int) or isinstance(v, bool) for v in ints.values()):
        raise WireError(f"{name}: round_id, sender and recipient must be integers")

    def ids(a: np.ndarray) -> list[int]:
        if a.dtype != np.int64 or a.ndim != 1 or len(np.unique(a)) != a.size:
            raise WireError(f"{name}: client ids must be distinct int64")
        return [int(x) for x in a]

    def rows(i: np.ndarray, b: np.ndarray) -> dict[int, bytes]:
        keys = ids(i)
        if b.dtype != np.uint8 or b.ndim != 2 or b.shape[0] != len(keys):
            raise WireError(f"{name}: expected one uint8 row per client id")
        return {k: bytes(b[j]) for j, k in enumerate(keys)}

    try:
        if cls is AdvertiseKeys:
            (k,) = arrays
            if k.dtype != np.uint8 or k.shape != (64,):
                raise WireError(f"{name}: keys must be uint8[64]")
            raw = bytes(k)
            return AdvertiseKeys(ints["round_id"], ints["sender"], raw[:32], raw[32:])
        if cls is KeyDirectory:
            got = rows(*arrays)
            if any(len(v) != 64 for v in got.values()):
                raise WireError(f"{name}: each key row must be 64 bytes")
            return KeyDirectory(ints["round_id"], ints["recipient"],
                                {c: (v[:32], v[32:]) for c, v in got.items()})
        if cls is ShareKeys:
            commit, i, b = arrays
            if commit.dtype != np.uint8 or commit.ndim != 1:
                raise WireError(f"{name}: the seed commitment must be uint8 bytes")
            return ShareKeys(ints["round_id"], ints["sender"], bytes(commit), rows(i, b))
        if cls is ForwardedShares:
            return ForwardedShares(ints["round_id"], ints["recipient"], rows(*arrays))
        if cls is MaskedInput:
            return MaskedInput(ints["round_id"], ints["sender"], arrays[0])
        if cls is UnmaskRequest:
            return UnmaskRequest(ints["round_id"], ints["recipient"],
                                 frozenset(ids(arrays[0])), frozenset(ids(arrays[1])),
                                 ints["num_survivors"])
        seed, keys = rows(arrays[0], arrays[1]), rows(arrays[2], arrays[3])
        return UnmaskResponse(ints["round_id"], ints["sender"],
                              {c: int.from_bytes(v, "big") for c, v in seed.items()},
                              {c: int.from_bytes(v, "big") for c, v in keys.items()})
    except KeyError as e:
        raise WireError(f"{name}: missing field {e.args[0]}") from None
