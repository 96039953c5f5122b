import itertools

import pytest

from plinth.fl.admm.kirkman import kirkman_triple_system, verify


@pytest.mark.parametrize("v", [9, 15, 21])
def test_design_property(v):
    design = kirkman_triple_system(v)
    assert len(design) == (v - 1) // 2
    pairs = []
    for cls in design:
        assert sorted(p for t in cls for p in t) == list(range(v))  # a partition into triples
        assert all(len(t) == 3 for t in cls)
        pairs += [pr for t in cls for pr in itertools.combinations(sorted(t), 2)]
    assert len(pairs) == len(set(pairs)) == v * (v - 1) // 2  # every pair exactly once
    verify(design, v)


def test_verify_catches_broken_designs():
    design = [list(c) for c in kirkman_triple_system(9)]
    with pytest.raises(ValueError, match="parallel classes"):
        verify(design[:-1], 9)
    broken = [list(c) for c in design]
    broken[1][0] = broken[0][0]
    with pytest.raises(ValueError):
        verify(broken, 9)


def test_rejects_bad_v():
    with pytest.raises(ValueError, match="3 \\(mod 6\\)"):
        kirkman_triple_system(11)
