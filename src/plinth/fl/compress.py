"""Update compression: 8/16-bit quantisation and top-k sparsification with error feedback.

These answer the talk's IO bottleneck with lower precision and pruning. A client's `Compressor`
turns a dense delta into the arrays that travel plus a codec name and metadata; the server's
`decompress` turns them back into dense deltas before they are folded.

- ``q8`` / ``q16``: per array, affine quantisation to uint8/uint16 between the array's min and
  max (one scale and offset per array), rounding to nearest.
- ``topk``: per array, the k = ⌈ratio·n⌉ entries largest in magnitude, as (uint32 index, float32
  value). With error feedback (Stich et al. 2018; Karimireddy et al. 2019) what was left out is
  kept by the client and added to its next update, so nothing is lost, only delayed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from plinth.core.registry import Registry
from plinth.fl.aggregate.accumulator import UpdateRejected
from plinth.fl.messages import NDArrays

_QTYPE = {"q8": np.uint8, "q16": np.uint16}


class Compressor:
    """Client-side encoder. Holds the error-feedback residual between rounds (top-k)."""

    def __init__(self, kind: str = "none", *, ratio: float = 0.01,
                 error_feedback: bool = True) -> None:
        self.kind, self.ratio, self.error_feedback = CODECS.check(kind), ratio, error_feedback
        self.codec = CODECS.get(self.kind)
        self.residual: NDArrays | None = None

    def encode(self, delta: NDArrays) -> tuple[NDArrays, str, dict[str, Any]]:
        """The arrays that travel, the codec name the server decodes them with, its metadata."""
        return self.codec.encode(self, delta)


def _plain(comp: Compressor, delta: NDArrays) -> tuple[NDArrays, str, dict[str, Any]]:
    return delta, "", {}


def _topk(comp: Compressor, delta: NDArrays) -> tuple[NDArrays, str, dict[str, Any]]:
    if comp.error_feedback and comp.residual is not None:
        delta = [d + r for d, r in zip(delta, comp.residual)]
    out: NDArrays = []
    specs = []
    residual: NDArrays = []
    for d in delta:
        flat = np.asarray(d, dtype=np.float32).reshape(-1)
        n = flat.size
        if not np.issubdtype(np.asarray(d).dtype, np.floating) or n == 0:
            specs.append({"shape": list(np.shape(d)), "dtype": np.asarray(d).dtype.str,
                          "raw": True})
            out.append(np.asarray(d))
            residual.append(np.zeros(np.shape(d), np.float32))
            continue
        k = max(1, min(n, math.ceil(comp.ratio * n)))
        idx = np.argpartition(np.abs(flat), n - k)[n - k:] if k < n else np.arange(n)
        idx = np.sort(idx).astype(np.uint32)
        vals = flat[idx]
        out += [idx, vals.astype(np.float32)]
        specs.append({"shape": list(np.shape(d)), "dtype": np.asarray(d).dtype.str,
                      "raw": False})
        rest = flat.copy()
        rest[idx] = 0
        residual.append(rest.reshape(np.shape(d)))
    if comp.error_feedback:
        comp.residual = residual
    return out, "topk", {"arrays": specs}


def _quantise(comp: Compressor, delta: NDArrays) -> tuple[NDArrays, str, dict[str, Any]]:
    kind = comp.kind
    qt = _QTYPE[kind]
    levels = float(np.iinfo(qt).max)
    out: NDArrays = []
    specs = []
    for d in delta:
        a = np.asarray(d)
        if not np.issubdtype(a.dtype, np.floating) or a.size == 0:
            out.append(a)
            specs.append({"raw": True})
            continue
        lo, hi = float(a.min()), float(a.max())
        scale = (hi - lo) / levels if hi > lo else 1.0
        q = np.rint((a.astype(np.float32) - lo) / scale).astype(qt)
        out.append(q)
        specs.append({"raw": False, "lo": lo, "scale": scale, "dtype": a.dtype.str})
    return out, kind, {"arrays": specs}


def decompress(arrays: NDArrays, codec: str, meta: dict[str, Any],
               template: list[tuple[tuple[int, ...], np.dtype]]) -> NDArrays:
    """Dense deltas from what a `Compressor` sent. A malformed payload raises `UpdateRejected`."""
    if codec == "":
        return arrays
    if codec not in CODECS or codec == "none":
        raise UpdateRejected(f"unknown codec {codec!r}")
    try:
        specs = meta["arrays"]
        if len(specs) != len(template):
            raise UpdateRejected(f"{codec}: {len(specs)} arrays, the model has {len(template)}")
        return CODECS.get(codec).decode(arrays, specs, template, codec)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise UpdateRejected(f"{codec}: malformed compressed update ({e})") from None


def _dequantise(arrays: NDArrays, specs: list[dict], template: list, codec: str) -> NDArrays:
    qt = _QTYPE[codec]
    if len(arrays) != len(specs):
        raise UpdateRejected(f"quantised update has {len(arrays)} arrays for {len(specs)} specs")
    out: NDArrays = []
    for i, (q, s, (shape, dtype)) in enumerate(zip(arrays, specs, template)):
        if s["raw"]:
            out.append(q)
            continue
        if q.dtype != qt or tuple(q.shape) != tuple(shape):
            raise UpdateRejected(f"array {i}: quantised {q.dtype}{tuple(q.shape)}, expected "
                                 f"{np.dtype(qt)}{tuple(shape)}")
        lo, scale = float(s["lo"]), float(s["scale"])
        x = q.astype(np.float32)
        x *= scale
        x += lo
        out.append(x.astype(dtype, copy=False))
    return out


def _densify(arrays: NDArrays, specs: list[dict], template: list, codec: str) -> NDArrays:
    out: NDArrays = []
    pos = 0
    for i, (s, (shape, dtype)) in enumerate(zip(specs, template)):
        if s["raw"]:
            out.append(arrays[pos])
            pos += 1
            continue
        idx, vals = arrays[pos], arrays[pos + 1]
        pos += 2
        n = math.prod(shape)
        if idx.shape != vals.shape or idx.ndim != 1 or (idx.size and int(idx.max()) >= n):
            raise UpdateRejected(f"array {i}: top-k indices out of range or mismatched")
        dense = np.zeros(n, dtype=dtype)
        dense[idx.astype(np.int64)] = vals
        out.append(dense.reshape(shape))
    if pos != len(arrays):
        raise UpdateRejected(f"top-k update has {len(arrays)} arrays, expected {pos}")
    return out


def _no_decode(arrays: NDArrays, specs: list[dict], template: list, codec: str) -> NDArrays:
    # An uncompressed update travels with codec "" and is never decoded (see decompress).
    raise UpdateRejected("an uncompressed update has no codec to decode")


@dataclass(frozen=True, slots=True)
class Codec:
    """One `compression.kind`: `encode(compressor, delta)` on the client, `decode(arrays,
    specs, template, name)` on the server."""

    encode: Callable[[Compressor, NDArrays], tuple[NDArrays, str, dict[str, Any]]]
    decode: Callable[[NDArrays, list[dict], list, str], NDArrays]


CODECS: Registry[Codec] = Registry("compression")
CODECS.add("none", Codec(_plain, _no_decode))
CODECS.add("q8", Codec(_quantise, _dequantise))
CODECS.add("q16", Codec(_quantise, _dequantise))
CODECS.add("topk", Codec(_topk, _densify))
