"""SecAgg+ wire messages (frozen dataclasses) and their on-the-wire sizes.

Every message carries ``round_id`` (stale or replayed rounds are rejected) and the sender or
recipient id. A transport serialises these; ``wire_size`` gives the bytes a compact fixed-width
encoding needs, which the benchmark reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.fl.privacy import shamir

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
