import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.fl.privacy import shamir


@settings(max_examples=40, deadline=None)
@given(secret=st.integers(0, 2**256 - 1), n=st.integers(1, 12), data=st.data())
def test_any_threshold_subset_recovers(secret, n, data):
    t = data.draw(st.integers(1, n))
    shares = shamir.split(secret, threshold=t, xs=range(1, n + 1))
    subset = data.draw(st.permutations(sorted(shares)))[:t]
    assert shamir.combine({x: shares[x] for x in subset}, threshold=t) == secret


def test_fewer_than_threshold_fail_or_mislead():
    shares = shamir.split(12345, threshold=3, xs=[1, 2, 3, 4])
    with pytest.raises(shamir.ShamirError, match="need 3 shares"):
        shamir.combine({1: shares[1], 2: shares[2]}, threshold=3)
    # Two shares are consistent with any secret: interpolating them gives garbage.
    assert shamir.interpolate({1: shares[1], 2: shares[2]}) != 12345


def test_bad_inputs():
    with pytest.raises(shamir.ShamirError, match="distinct"):
        shamir.split(1, threshold=1, xs=[1, 1])
    with pytest.raises(shamir.ShamirError, match="threshold"):
        shamir.split(1, threshold=5, xs=[1, 2])
    with pytest.raises(shamir.ShamirError, match="outside the field"):
        shamir.combine({1: shamir.PRIME}, threshold=1)


def test_combine_verified_names_bad_share(caplog):
    secret = int.from_bytes(os.urandom(32), "big")
    shares = shamir.split(secret, threshold=3, xs=range(1, 7))
    shares[1] = (shares[1] + 7) % shamir.PRIME
    got, bad = shamir.combine_verified(shares, threshold=3, verify=lambda s: s == secret)
    assert got == secret and bad == [1]
    assert "rejected invalid Shamir share at x=1" in caplog.text
    with pytest.raises(shamir.ShamirError, match="verifies"):
        shamir.combine_verified(shares, threshold=3, verify=lambda s: False)


def test_prime_is_prime():
    # Miller-Rabin with fixed bases; p - 2^256 = 297.
    p = shamir.PRIME
    d, r = p - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41):
        x = pow(a, d, p)
        if x in (1, p - 1):
            continue
        for _ in range(r - 1):
            x = pow(x, 2, p)
            if x == p - 1:
                break
        else:
            raise AssertionError(f"{a} witnesses that p is composite")


def test_coefficients_reproduce_polynomial():
    shares = shamir.split(99, threshold=5, xs=range(1, 11))
    basis = {x: shares[x] for x in (2, 4, 6, 8, 10)}
    poly = shamir.coefficients(basis)
    assert poly[0] == 99
    assert all(shamir.evaluate(poly, x) == y for x, y in shares.items())
