"""Building blocks of secure aggregation: fixed-point encoding, key derivation, mask expansion, graphs.

Fixed-point encoding
    A float update ``x`` is clipped coordinate-wise to ``[-clip, clip]``, multiplied by ``scale``
    and rounded (to nearest, or stochastically when an ``rng`` is given, which is unbiased) to an
    integer, then taken mod 2^32. Sums wrap mod 2^32 and decode correctly as long as the true
    integer sum stays inside int32: ``n * clip * scale < 2^31``; :func:`check_encoding` enforces
    that. The rounding error of a decoded sum is at most ``n / (2 * scale)`` per coordinate.
    Default scale 2^16 with clip 1.0 allows up to 32,767 clients at 1.5e-5 resolution.

Masks
    Each mask is the ChaCha20 keystream (RFC 7539 cipher, 256-bit key, zero nonce) read as
    little-endian uint32 words. Keys come from X25519 agreements or a 32-byte random seed, through
    HKDF-SHA256 with an ``info`` string that binds the purpose, the round and the two client ids,
    so every (round, pair) has its own full 256-bit key and a zero nonce is never reused.
"""

from __future__ import annotations

import functools
import math

import networkx as nx
import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MODULUS_BITS = 32
INT32_LIMIT = 1 << 31
_ZERO_NONCE = bytes(16)


def check_encoding(*, num_clients: int, clip: float, scale: float) -> None:
    """Raise ValueError when ``num_clients`` encoded updates could overflow the int32 sum."""
    if clip <= 0 or scale <= 0:
        raise ValueError(f"clip and scale must be positive, got clip={clip}, scale={scale}")
    bound = num_clients * math.ceil(clip * scale)
    if bound >= INT32_LIMIT:
        raise ValueError(
            f"num_clients * clip * scale = {bound} >= 2^31: the mod-2^32 sum would wrap; "
            f"lower scale (now {scale}) or clip (now {clip})"
        )


def quantize(
    x: np.ndarray, *, clip: float, scale: float, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Encode floats as uint32 (two's complement of the rounded fixed-point value)."""
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("update contains NaN or inf; refusing to encode it")
    scaled = np.clip(arr, -clip, clip) * scale
    if rng is None:
        ints = np.rint(scaled)
    else:
        floor = np.floor(scaled)
        ints = floor + (rng.random(scaled.shape) < (scaled - floor))
    return ints.astype(np.int64).astype(np.uint32)


def dequantize(total: np.ndarray, *, scale: float) -> np.ndarray:
    """Decode a mod-2^32 sum of encoded updates back to floats."""
    return np.asarray(total, dtype=np.uint32).view(np.int32).astype(np.float64) / scale


def derive_key(material: bytes, *, info: bytes) -> bytes:
    """HKDF-SHA256 of ``material`` to a 32-byte key for one purpose (``info``)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(material)


def expand_mask(key: bytes, length: int) -> np.ndarray:
    """``length`` uint32 words of ChaCha20 keystream under the full 256-bit ``key``."""
    if len(key) != 32:
        raise ValueError(f"mask key must be 32 bytes, got {len(key)}")
    enc = Cipher(algorithms.ChaCha20(key, _ZERO_NONCE), mode=None).encryptor()
    stream = enc.update(bytes(4 * length))
    return np.frombuffer(stream, dtype="<u4").astype(np.uint32, copy=False)


def _info(label: bytes, round_id: int, *ids: int) -> bytes:
    """HKDF `info` binding a key's purpose, the round and the client ids (8 bytes each)."""
    return b"plinth-secagg/" + label + b"/" + b"".join(
        x.to_bytes(8, "big") for x in (round_id, *ids))


def pair_info(round_id: int, a: int, b: int) -> bytes:
    return _info(b"pair", round_id, min(a, b), max(a, b))


def self_info(round_id: int, client: int) -> bytes:
    return _info(b"self", round_id, client)


def share_info(round_id: int, a: int, b: int) -> bytes:
    return _info(b"share", round_id, min(a, b), max(a, b))


def default_degree(n: int) -> int:
    """SecAgg+ neighbourhood size: about 2 log2(n), even so a k-regular graph always exists."""
    if n <= 1:
        return 0
    k = 2 * math.ceil(math.log2(n))
    if k >= n - 1:
        return n - 1
    return k if (n * k) % 2 == 0 else k + 1


@functools.lru_cache(maxsize=32)  # every party of a round builds the same graph
def neighbour_graph(
    client_ids: tuple[int, ...], *, degree: int | None, full_graph: bool, seed: int
) -> dict[int, tuple[int, ...]]:
    """Neighbours of each client: complete graph (SecAgg) or a seeded random k-regular graph (SecAgg+)."""
    n = len(client_ids)
    ids = sorted(client_ids)
    if full_graph:
        return {c: tuple(o for o in ids if o != c) for c in ids}
    k = default_degree(n) if degree is None else degree
    if not 0 < k < n or (n * k) % 2:
        raise ValueError(f"degree {k} invalid for {n} clients: need 0 < k < n and n*k even")
    if k == n - 1:
        return {c: tuple(o for o in ids if o != c) for c in ids}
    graph = nx.random_regular_graph(k, n, seed=seed)
    return {ids[u]: tuple(sorted(ids[v] for v in graph.neighbors(u))) for u in range(n)}
