"""Shamir secret sharing over the prime field GF(p), p = 2^256 + 297 (the least prime above 2^256).

A secret (at most 256 bits, e.g. a 32-byte key) is the constant term of a random polynomial of
degree ``threshold - 1``; holder ``x`` gets the polynomial's value at ``x``. Any ``threshold``
shares recover the secret by Lagrange interpolation at 0, fewer reveal nothing about it.

Plain Shamir cannot tell a wrong share from a right one. :func:`combine_verified` takes a check
on the recovered secret (a hash commitment, or "this private key matches the advertised public
key") and searches subsets of the shares until one passes, then names the shares that do not lie
on the recovered polynomial.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterable, Mapping

log = logging.getLogger("plinth.fl.privacy.shamir")

PRIME = (1 << 256) + 297  # least prime above 2^256, so every 32-byte secret fits
SHARE_BYTES = 33  # a share's y value on the wire


class ShamirError(ValueError):
    """Shares that cannot give back the secret (too few, duplicated, out of range, inconsistent)."""


def _random_field_element(random_bytes: Callable[[int], bytes]) -> int:
    # 64 extra bits of randomness make the bias of the reduction negligible (< 2^-64).
    return int.from_bytes(random_bytes(SHARE_BYTES + 8), "big") % PRIME


def split(
    secret: int | bytes,
    *,
    threshold: int,
    xs: Iterable[int],
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> dict[int, int]:
    """Share ``secret`` among the holders ``xs`` (distinct, 1 <= x < PRIME); ``threshold`` recover it."""
    value = int.from_bytes(secret, "big") if isinstance(secret, bytes) else int(secret)
    points = list(xs)
    if not 0 <= value < PRIME:
        raise ShamirError(f"secret out of range for GF(p): {value.bit_length()} bits")
    if len(set(points)) != len(points):
        raise ShamirError(f"holder x values must be distinct, got {points}")
    if any(not 0 < x < PRIME for x in points):
        raise ShamirError("holder x values must be in [1, PRIME)")
    if not 1 <= threshold <= len(points):
        raise ShamirError(
            f"threshold {threshold} must be in [1, {len(points)}] (number of holders)"
        )
    coeffs = [value] + [_random_field_element(random_bytes) for _ in range(threshold - 1)]
    shares = {}
    for x in points:
        acc = 0
        for c in reversed(coeffs):  # Horner
            acc = (acc * x + c) % PRIME
        shares[x] = acc
    return shares


def interpolate(shares: Mapping[int, int], at: int = 0) -> int:
    """Value at ``at`` of the unique polynomial of degree < len(shares) through ``shares``."""
    xs = list(shares)
    if len(set(xs)) != len(xs) or not xs:
        raise ShamirError("need at least one share with distinct x values")
    nums, dens = [], []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * (at - xj) % PRIME
                den = den * (xi - xj) % PRIME
        nums.append(num)
        dens.append(den)
    # One modular inversion for all denominators (Montgomery's batch trick): pow() dominates.
    prefix = [1]
    for d in dens:
        prefix.append(prefix[-1] * d % PRIME)
    inv = pow(prefix[-1], PRIME - 2, PRIME)
    total = 0
    for i in range(len(xs) - 1, -1, -1):
        inv_d = inv * prefix[i] % PRIME
        inv = inv * dens[i] % PRIME
        total = (total + shares[xs[i]] * nums[i] * inv_d) % PRIME
    return total


def _batch_inverse(values: list[int]) -> list[int]:
    """Inverses of all ``values`` mod PRIME with a single pow() (Montgomery's trick)."""
    prefix = [1]
    for d in values:
        prefix.append(prefix[-1] * d % PRIME)
    inv = pow(prefix[-1], PRIME - 2, PRIME)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inv * prefix[i] % PRIME
        inv = inv * values[i] % PRIME
    return out


def coefficients(shares: Mapping[int, int]) -> list[int]:
    """Coefficients (constant first) of the polynomial through ``shares``, in O(t^2)."""
    xs = list(shares)
    t = len(xs)
    master = [1]  # prod (x - x_j), constant first
    for xj in xs:
        nxt = [0] * (len(master) + 1)
        for k, c in enumerate(master):
            nxt[k] = (nxt[k] - xj * c) % PRIME
            nxt[k + 1] = (nxt[k + 1] + c) % PRIME
        master = nxt
    dens = []
    for i, xi in enumerate(xs):
        den = 1
        for j, xj in enumerate(xs):
            if i != j:
                den = den * (xi - xj) % PRIME
        dens.append(den)
    weights = [shares[x] * inv % PRIME for x, inv in zip(xs, _batch_inverse(dens), strict=True)]
    coeffs = [0] * t
    for xi, wi in zip(xs, weights, strict=True):
        # master / (x - xi) by synthetic division, from the top coefficient down.
        carry = 0
        for k in range(t, 0, -1):
            carry = (master[k] + carry * xi) % PRIME
            coeffs[k - 1] = (coeffs[k - 1] + wi * carry) % PRIME
    return coeffs


def evaluate(coeffs: list[int], x: int) -> int:
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % PRIME
    return acc


def _check_shares(shares: Mapping[int, int], threshold: int) -> None:
    if len(shares) < threshold:
        raise ShamirError(f"need {threshold} shares, got {len(shares)}")
    for x, y in shares.items():
        if not 0 < x < PRIME or not 0 <= y < PRIME:
            raise ShamirError(f"share at x={x} is outside the field")


def combine(shares: Mapping[int, int], *, threshold: int) -> int:
    """Recover the secret from the first ``threshold`` shares (no validity check)."""
    _check_shares(shares, threshold)
    chosen = dict(itertools.islice(sorted(shares.items()), threshold))
    return interpolate(chosen, 0)


def combine_verified(
    shares: Mapping[int, int],
    *,
    threshold: int,
    verify: Callable[[int], bool],
    max_tries: int = 256,
) -> tuple[int, list[int]]:
    """Recover a secret that passes ``verify``; return it and the x values of invalid shares.

    Tries subsets of ``threshold`` shares in a fixed order (deterministic), at most ``max_tries``.
    Every unused share is checked against the recovered polynomial (O(t) each) and named if off it.
    """
    _check_shares(shares, threshold)
    items = sorted(shares.items())
    head = items[: threshold + 1]
    # First the plain subset, then each leave-one-out of the first t+1 (one bad share costs at most
    # t+1 tries), then the remaining combinations in order.
    candidates = itertools.chain(
        [items[:threshold]],
        (head[:i] + head[i + 1 :] for i in range(len(head))) if len(head) > threshold else (),
        itertools.combinations(items, threshold),
    )
    for tries, subset in enumerate(candidates):
        if tries >= max_tries:
            break
        basis = dict(subset)
        secret = interpolate(basis, 0)
        if not verify(secret):
            continue
        poly = coefficients(basis)
        bad = [x for x, y in items if x not in basis and evaluate(poly, x) != y]
        # A share inside a verified basis lies on the polynomial by construction.
        for x in bad:
            log.warning("rejected invalid Shamir share at x=%d: not on the verified polynomial", x)
        return secret, bad
    raise ShamirError(
        f"no subset of {threshold} of the {len(items)} shares gives a secret that verifies"
    )
