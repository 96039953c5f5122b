"""The streaming aggregation engine: fold each update into a running weighted sum as it arrives.

After LIFL (Qi et al., MLSys'24), aggregation is *eager*: the server never holds more than the
accumulator and the update in flight, so memory stays O(model) whatever the number of clients.

Each `add` is one pass over a zero-copy view of the update (straight out of the received buffer),
through one compiled kernel (numba, `nogil`) that checks and folds in the same pass:

- the update is walked in blocks of 1,024 elements (4 KiB of float32, resident in L1). Per block
  the kernel first counts the elements whose exponent is at or past a limit, then folds
  ``acc += w * update`` from L1. So memory sees one read of the update and one read and write
  of the accumulator, however much checking is done;
- the limit is an exponent threshold: NaN and Inf (all exponent bits set) always fail it, and so
  does any finite element with ``|w·x| >= 2^106`` (float32; ``2^1002`` for float64 accumulators).
  With that bound the sum of up to 2^20 updates can never overflow, so the accumulator stays
  finite and every refusal happens *before* anything of the bad block is stored;
- a bad element found part-way through is undone exactly where it was found: the blocks already
  folded are subtracted again, so the accumulator is left as it was up to rounding (one ulp per
  element at most), and `UpdateRejected` names the array and index;
- `threads` splits the parameter vector across our own threads (the kernel releases the GIL),
  which keeps each core on its own slice of memory. No BLAS runs here, so there is no BLAS
  thread pool to pin;
- the kernel is compiled once per accumulator dtype and cached on disk (numba ``cache=True``).

The previous engine checked each 256 KiB chunk with a BLAS dot against the accumulator and then
folded it with a BLAS axpy: two passes, 64–96% of a memory copy at 1M parameters. One pass with
the check in L1 reaches copy speed or better (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from numba import njit

from plinth.core.errors import PlinthError
from plinth.fl.aggregate.accumulator import (
    Accumulator,
    UpdateRejected,
    check_shapes,
    template_of,
    vet,
)
from plinth.fl.messages import NDArray, NDArrays

DEFAULT_CHUNK_BYTES = 512 * 1024
BLOCK = 1024  # elements checked, then folded, while in L1
MAX_UPDATES_LOG2 = 20  # the overflow bound below holds for up to 2^20 updates per sum


def acc_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulate float64 models in float64 and everything else in float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


class StreamingAggregator(Accumulator):
    """A running weighted sum of updates shaped like `template`.

    `template` is a list of arrays (or of ``(shape, dtype)`` pairs) describing the model.
    `threads` splits the parameters across that many threads, in `chunk_bytes` pieces balanced by
    element count.
    """

    def __init__(self, template: Sequence[Any], *, threads: int = 1,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, check_finite: bool = True) -> None:
        self.template = template_of(template)
        self.check_finite = check_finite
        self.threads = max(1, int(threads))
        sizes = [math.prod(s) for s, _ in self.template]
        dtypes = [acc_dtype(d) for _, d in self.template]
        # One buffer per array, allocated back to back (models are almost always one dtype).
        self._acc = [np.zeros(n, dtype=dt) for n, dt in zip(sizes, dtypes)]
        units: list[tuple[int, int, int]] = []
        for i, (n, dt) in enumerate(zip(sizes, dtypes)):
            step = max(1024, chunk_bytes // dt.itemsize)
            units += [(i, s, min(n, s + step)) for s in range(0, n, step)]
        # Contiguous runs of work units per thread, balanced by element count.
        total = sum(sizes) or 1
        self._parts: list[list[tuple[int, int, int]]] = [[] for _ in range(self.threads)]
        seen = 0
        for u in units:
            k = min(self.threads - 1, seen * self.threads // total)
            self._parts[k].append(u)
            seen += u[2] - u[1]
        # within a thread's share, one range per array: the kernel walks it in L1-sized blocks
        self._parts = [_coalesce(p) for p in self._parts if p]
        self._views = {u: self._acc[u[0]][u[1]:u[2]] for p in self._parts for u in p}
        self._pool = ThreadPoolExecutor(len(self._parts)) if len(self._parts) > 1 else None
        self.total_weight = 0.0
        self.count = 0
        self.metrics: dict[str, float] = {}  # what the round's record gets from the accumulator
        self._mean: NDArrays | None = None

    # -- folding --------------------------------------------------------------------------------

    def _fold(self, part: list[tuple[int, int, int]], flats: list[list[NDArray]],
              weights: list[float], check: bool) -> dict[int, str]:
        """Fold each update over `part` (one kernel call per array range); a bad update is
        undone over this part and reported."""
        bad: dict[int, str] = {}
        for j, (flat, w) in enumerate(zip(flats, weights)):
            limits: dict[np.dtype, Any] = {}
            for done, unit in enumerate(part):
                dst = self._views[unit]
                dt = dst.dtype
                lim = limits.get(dt)
                if lim is None:
                    lim = limits[dt] = _limit(dt, w, check)
                x = flat[unit[0]][unit[1]:unit[2]]
                if x.dtype != dt:
                    x = x.astype(dt)
                ut, mask = _UINT[dt]
                at = _fold_checked(dst, x, x.view(ut), mask, lim, dt.type(w), BLOCK)
                if at >= 0:
                    bad[j] = f"array {unit[0]}, {_why(x, at, lim, unit[1])}"
                    self._undo(part[:done], flat, w)
                    break
        return bad

    def _undo(self, units: list[tuple[int, int, int]], flat: list[NDArray], weight: float) -> None:
        for unit in units:
            dst = self._views[unit]
            x = flat[unit[0]][unit[1]:unit[2]]
            if x.dtype != dst.dtype:
                x = x.astype(dst.dtype)
            _axpy(dst, x, dst.dtype.type(-weight))

    def add_many(self, updates: Sequence[tuple[NDArrays, float]]) -> list[tuple[int, str]]:
        """Fold several updates (replies that arrived together) in one call.

        Returns ``(index, reason)`` for the updates rejected; the others are folded. With
        `threads` > 1, each thread folds every update over its own slice of the parameters.
        """
        if self._mean is not None:
            raise PlinthError("aggregator: mean() was taken; reset() before adding again")
        good, refused = vet(self.template, updates)
        rejected = dict(refused)
        # views, not copies: decoded arrays are contiguous
        flats = [[np.asarray(a).reshape(-1) for a in updates[j][0]] for j in good]
        weights = [float(updates[j][1]) for j in good]
        if flats:
            if self._pool is None:
                results = [self._fold(p, flats, weights, self.check_finite)
                           for p in self._parts]
            else:
                futs = [self._pool.submit(self._fold, p, flats, weights, self.check_finite)
                        for p in self._parts]
                results = [f.result() for f in futs]
            bad = {k: r for res in results for k, r in res.items()}
            for part, res in zip(self._parts, results):
                for k in bad:
                    if k not in res:  # folded in this part before another part found it bad
                        self._undo(part, flats[k], weights[k])
            for k, reason in bad.items():
                rejected[good[k]] = reason
            for k, j in enumerate(good):
                if k not in bad:
                    self.total_weight += weights[k]
                    self.count += 1
        return sorted(rejected.items())

    def add_sum(self, sums: NDArrays, total_weight: float, count: int) -> None:
        """Fold a partial weighted sum made by another aggregator (the hierarchy's upper levels)."""
        if self._mean is not None:
            raise PlinthError("aggregator: mean() was taken; reset() before adding again")
        check_shapes([(s, acc_dtype(d)) for s, d in self.template], sums)
        flat = [np.asarray(a).reshape(-1) for a in sums]
        done = []
        for p in self._parts:
            r = self._fold(p, [flat], [1.0], self.check_finite)
            if r:
                for q in done:
                    self._undo(q, flat, 1.0)
                raise UpdateRejected(r[0])
            done.append(p)
        self.total_weight += float(total_weight)
        self.count += int(count)

    # -- results --------------------------------------------------------------------------------

    def sums(self) -> NDArrays:
        """The weighted sums, shaped like the model, in the accumulator dtype (views)."""
        return [a.reshape(s) for a, (s, _) in zip(self._acc, self.template)]

    def mean(self) -> NDArrays | None:
        """The weighted mean in the model's dtypes; None if nothing was added.

        The division happens in place in the accumulator (so peak memory stays one model), which
        ends the accumulation: later `add` calls raise until `reset`.
        """
        if self.count == 0:
            return None
        if self._mean is None:
            out = []
            for a, (shape, dt) in zip(self._acc, self.template):
                np.multiply(a, 1.0 / self.total_weight, out=a)
                if np.issubdtype(dt, np.integer) or np.dtype(dt) == np.bool_:
                    np.rint(a, out=a)
                out.append(a.astype(dt, copy=False).reshape(shape))
            self._mean = out
        return self._mean

    def reset(self) -> None:
        for a in self._acc:
            a.fill(0)
        self.total_weight, self.count, self._mean = 0.0, 0, None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def __del__(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self.close()


# -- the kernels ----------------------------------------------------------------------------------

# Per accumulator dtype: (exponent mask, exponent bias, exponent of the bound 2^k on |w·x|).
# |w·x| < 2^k for each of up to 2^MAX_UPDATES_LOG2 updates keeps the sum below the dtype's max.
_EXP = {np.dtype(np.float32): (0x7F800000, 127, 23, 127 - 1 - MAX_UPDATES_LOG2),
        np.dtype(np.float64): (0x7FF0000000000000, 1023, 52, 1023 - 1 - MAX_UPDATES_LOG2)}


# per accumulator dtype: the unsigned type of the same width, and its exponent mask in that type
_UINT = {dt: (ut, ut(_EXP[dt][0])) for dt, ut in ((np.dtype(np.float32), np.uint32),
                                                   (np.dtype(np.float64), np.uint64))}


def _limit(dtype: np.dtype, weight: float, check: bool) -> Any:
    """The smallest biased-exponent bit pattern refused for an element folded with `weight`:
    elements at or past it are NaN, Inf, or so large that |w·x| could overflow the sum."""
    mask, bias, mant, k = _EXP[np.dtype(dtype)]
    ut = _UINT[np.dtype(dtype)][0]
    if not check:
        return ut(mask + 1)  # no exponent pattern reaches it
    e = bias + k - max(0, math.ceil(math.log2(weight)))
    return ut(min(mask, max(0, e) << mant))


def _why(x: NDArray, at: int, lim: Any, offset: int) -> str:
    """Why the block of `x` at `at` was refused, naming the first offending element (`x` starts
    at `offset` in its array)."""
    ut, mask = _UINT[x.dtype]
    k = at + int(np.argmax((x.view(ut)[at:at + BLOCK] & mask) >= lim))
    return (f"index {offset + k}: NaN or Inf, or a value past the sum's bound "
            f"(|w·x| >= 2^{_EXP[x.dtype][3]}): {x[k]!r}")


def _coalesce(units: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for i, s, e in units:
        if out and out[-1][0] == i and out[-1][2] == s:
            out[-1] = (i, out[-1][1], e)
        else:
            out.append((i, s, e))
    return out


@njit(nogil=True, cache=True, fastmath={"contract"})
def _fold_checked(acc: Any, x: Any, bits: Any, mask: Any, lim: Any, w: Any,
                  block: int) -> int:  # pragma: no cover
    """acc += w·x, block by block, refusing a block with an element whose exponent bits
    (``bits``: x viewed as unsigned integers, ``& mask``) are at or past `lim`. Returns -1, or
    the block's offset after undoing the blocks already folded."""
    n = x.shape[0]
    for b in range((n + block - 1) // block):
        s = b * block
        e = min(n, s + block)
        xb = bits[s:e]
        over = 0
        for i in range(xb.shape[0]):
            over += (xb[i] & mask) >= lim
        if over:
            a, xx = acc[:s], x[:s]
            for i in range(a.shape[0]):
                a[i] -= w * xx[i]
            return s
        a, xx = acc[s:e], x[s:e]
        for i in range(a.shape[0]):
            a[i] += w * xx[i]
    return -1


@njit(nogil=True, cache=True, fastmath={"contract"})
def _axpy(acc: Any, x: Any, w: Any) -> None:  # pragma: no cover
    for i in range(acc.shape[0]):
        acc[i] += w * x[i]


def weighted_mean(updates: Sequence[tuple[NDArrays, float]], **kw: Any) -> NDArrays | None:
    """The weighted mean of `(arrays, weight)` pairs, folded one at a time."""
    if not updates:
        return None
    agg = StreamingAggregator(updates[0][0], **kw)
    try:
        for arrays, w in updates:
            agg.add(arrays, w)
        return agg.mean()
    finally:
        agg.close()
