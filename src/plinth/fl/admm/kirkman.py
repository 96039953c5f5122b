"""Kirkman triple systems KTS(v), v = 3 (mod 6): (v-1)/2 parallel classes of triples, each pair once.

Construction: a 1-rotational KTS. Points are Z_{v-1} plus a point at infinity (labelled v-1);
h = (v-1)/2. A base parallel class is {inf, 0, h} plus m = (h-1)/3 triples T_1..T_m and their
translates T_i + h, which together partition Z_{v-1} minus {0, h}. If the differences (up to sign)
of the T_i cover 1..h-1 exactly once, then translating the base class by 0, 1, ..., h-1 gives h
parallel classes in which every pair lies in exactly one triple: pairs {inf, x} and {x, x+h} come
from the first triple's orbit, every other difference d from the unique T_i that owns d.

The base triples are found by a depth-first search with rollback (backtracking). That cyclic form
exists for 9, 27, 33 but not for 15 or 21; for those the points are Z_m x {0..L-1} plus infinity
(v - 1 = m L, m odd) and L/2 base classes are developed by Z_m: the search then asks that every
pair orbit of Z_m be covered once. For v = 15 it succeeds instantly; for v = 21 it takes about
20 s, so its result is stored below as a certificate. :func:`verify` checks every design.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

Triple = tuple[int, int, int]
Design = list[list[Triple]]


def _diff(a: int, b: int, n: int) -> int:
    d = (a - b) % n
    return min(d, n - d)


def _base_triples(v: int) -> list[Triple]:
    n, h = v - 1, (v - 1) // 2
    m = (h - 1) // 3
    used_pts = {0, h}
    used_diffs: set[int] = set()
    chosen: list[Triple] = []

    def search() -> bool:
        if len(chosen) == m:
            return len(used_diffs) == h - 1
        a = min(
            x for x in range(n) if x not in used_pts
        )  # fix the smallest free point: no symmetric repeats
        for b, c in itertools.combinations([x for x in range(a + 1, n) if x not in used_pts], 2):
            tri = (a, b, c)
            shifted = [(x + h) % n for x in tri]
            pts = set(tri) | set(shifted)
            if len(pts) != 6 or pts & used_pts:
                continue
            diffs = {_diff(a, b, n), _diff(a, c, n), _diff(b, c, n)}
            if len(diffs) != 3 or h in diffs or diffs & used_diffs:
                continue
            chosen.append(tri)
            used_pts.update(pts)
            used_diffs.update(diffs)
            if search():
                return True
            chosen.pop()  # roll back
            used_pts.difference_update(pts)
            used_diffs.difference_update(diffs)
        return False

    if not search():
        raise RuntimeError(f"no 1-rotational base class found for v={v}")
    return chosen


def _orbit(p: tuple[int, int] | None, q: tuple[int, int] | None, m: int) -> tuple:
    if p is None or q is None:
        return ("inf", (q if p is None else p)[1])
    (x, i), (y, j) = sorted([p, q], key=lambda t: (t[1], t[0]))
    if i == j:
        d = (y - x) % m
        return ("pure", i, min(d, m - d))
    return ("mixed", i, j, (y - x) % m)


def _orbit_bases(m: int, levels: int, max_steps: int = 5_000_000) -> list[list[Triple]]:
    """levels/2 base classes on [inf] + Z_m x levels (index 0 is inf) covering each pair orbit once."""
    pts: list[tuple[int, int] | None] = [None] + [(x, i) for i in range(levels) for x in range(m)]
    want = levels // 2
    used: set[tuple] = set()
    bases: list[list[Triple]] = []
    cur: list[Triple] = []
    free = set(range(len(pts)))
    steps = 0

    def dfs() -> bool:
        nonlocal steps
        steps += 1
        if steps > max_steps:
            raise RuntimeError(
                f"Kirkman search for m={m}, levels={levels} gave up after {max_steps} steps"
            )
        if not free:
            bases.append(list(cur))
            saved = list(cur)
            if len(bases) == want:
                return True
            cur.clear()
            free.update(range(len(pts)))
            if dfs():
                return True
            cur.extend(saved)
            free.clear()
            bases.pop()
            return False
        p = min(free)
        for a, b in itertools.combinations(sorted(free - {p}), 2):
            orbits = {
                _orbit(pts[p], pts[a], m),
                _orbit(pts[p], pts[b], m),
                _orbit(pts[a], pts[b], m),
            }
            if len(orbits) < 3 or orbits & used:
                continue
            used.update(orbits)
            free.difference_update((p, a, b))
            cur.append((p, a, b))
            if dfs():
                return True
            used.difference_update(orbits)  # roll back
            free.update((p, a, b))
            cur.pop()
        return False

    if not dfs():
        raise RuntimeError(f"no orbit design for m={m}, levels={levels}")
    return bases


# Found by _orbit_bases(5, 4) (about 20 s); verify() re-checks the developed design every time.
_CERTIFICATES: dict[int, tuple[int, int, list[list[Triple]]]] = {
    21: (
        5,
        4,
        [
            [
                (0, 1, 6),
                (2, 3, 9),
                (4, 7, 11),
                (5, 15, 16),
                (8, 17, 20),
                (10, 12, 13),
                (14, 18, 19),
            ],
            [
                (0, 11, 18),
                (1, 12, 14),
                (2, 5, 20),
                (3, 7, 17),
                (4, 13, 16),
                (6, 8, 19),
                (9, 10, 15),
            ],
        ],
    ),
}


def _develop_orbit(v: int, m: int, bases: list[list[Triple]]) -> Design:
    def label(idx: int, shift: int) -> int:
        if idx == 0:
            return v - 1
        x, lvl = (idx - 1) % m, (idx - 1) // m
        return lvl * m + (x + shift) % m

    return [
        sorted(tuple(sorted(label(i, s) for i in tri)) for tri in base)
        for base in bases
        for s in range(m)
    ]


def kirkman_triple_system(v: int) -> Design:
    """The (v-1)/2 parallel classes of a KTS(v) on sites 0..v-1 (sorted triples, sorted classes)."""
    if v < 3 or v % 6 != 3:
        raise ValueError(f"a Kirkman triple system needs v = 3 (mod 6), got v={v}")
    if v == 3:
        return [[(0, 1, 2)]]
    if v in _CERTIFICATES:
        m, _, bases = _CERTIFICATES[v]
        design = _develop_orbit(v, m, bases)
        verify(design, v)
        return design
    try:
        base = _base_triples(v)
    except RuntimeError:
        m = max(d for d in range(1, v, 2) if (v - 1) % d == 0 and ((v - 1) // d) % 2 == 0)
        design = _develop_orbit(v, m, _orbit_bases(m, (v - 1) // m))
        verify(design, v)
        return design
    n, h = v - 1, (v - 1) // 2
    inf = v - 1
    design = []
    for s in range(h):
        cls = [tuple(sorted((inf, s % n, (s + h) % n)))]
        for tri in base:
            for off in (0, h):
                cls.append(tuple(sorted((x + s + off) % n for x in tri)))
        design.append(sorted(cls))
    verify(design, v)
    return design


def verify(design: Sequence[Sequence[Triple]], v: int) -> None:
    """Raise ValueError unless ``design`` is a KTS(v): right class count, partitions, each pair once."""
    if len(design) != (v - 1) // 2:
        raise ValueError(f"expected {(v - 1) // 2} parallel classes, got {len(design)}")
    seen: dict[tuple[int, int], int] = {}
    for k, cls in enumerate(design):
        pts = [p for tri in cls for p in tri]
        if any(len(set(t)) != 3 for t in cls) or sorted(pts) != list(range(v)):
            raise ValueError(f"class {k} is not a partition of the {v} sites into triples")
        for tri in cls:
            for pair in itertools.combinations(sorted(tri), 2):
                if pair in seen:
                    raise ValueError(f"pair {pair} appears in classes {seen[pair]} and {k}")
                seen[pair] = k
    if len(seen) != v * (v - 1) // 2:
        raise ValueError(f"{v * (v - 1) // 2 - len(seen)} pairs never meet")
