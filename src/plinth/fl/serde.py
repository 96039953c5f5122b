"""Messages to bytes and back: a small JSON header, then raw little-endian array buffers.

Layout of one message::

    b"PLF1" | u32 header length (LE) | header JSON (utf-8) | zero pad to 64 | array 0 | pad | ...

The header holds the message kind, its scalar fields, and for each array its dtype string (always
little-endian, e.g. ``<f4``), shape and byte offset. Every array starts on a 64-byte boundary, so
`decode` returns `np.frombuffer` views into the received buffer: no array is copied on the way in.
Views into a `bytes` object are read-only; views into a `bytearray` are writable.

Pairs are symmetric: `arrays_to_bytes`/`arrays_from_bytes` and `encode`/`decode`. A malformed
buffer raises `SerdeError`, one line that says what is wrong.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl.messages import (
    ClientInfo,
    ErrorRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    NDArrays,
    SecAggIns,
    SecAggRes,
)

MAGIC = b"PLF1"
ALIGN = 64
MAX_HEADER = 16 << 20
_PREFIX = struct.Struct("<4sI")
# dtypes a message may carry; anything else (objects, strings, big-endian) is refused.
ALLOWED_DTYPES = frozenset(
    np.dtype(t).newbyteorder("<").str
    for t in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"))
_DTYPES = {t: np.dtype(t) for t in ALLOWED_DTYPES}  # decode looks each one up, never parses


class SerdeError(PlinthError):
    """A buffer is not a valid Plinth FL message."""


# kind name → (class, name of its array field or None)
_KINDS: dict[str, tuple[type, str | None]] = {
    "fit_ins": (FitIns, "parameters"),
    "fit_res": (FitRes, "update"),
    "evaluate_ins": (EvaluateIns, "parameters"),
    "evaluate_res": (EvaluateRes, None),
    "error_res": (ErrorRes, None),
    "client_info": (ClientInfo, None),
    "secagg_ins": (SecAggIns, "arrays"),
    "secagg_res": (SecAggRes, "arrays"),
    "arrays": (list, None),
}
_KIND_OF = {cls: kind for kind, (cls, _) in _KINDS.items() if cls is not list}


def _pad(n: int) -> int:
    return (-n) % ALIGN


def _le(a: Any) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr


def _pack(kind: str, meta: dict[str, Any], arrays: NDArrays) -> bytearray:
    arrs = [np.require(_le(a), requirements="C") for a in arrays]
    specs = []
    for i, a in enumerate(arrs):
        dt = a.dtype.newbyteorder("<").str
        if dt not in ALLOWED_DTYPES:
            raise SerdeError(f"array {i}: dtype {a.dtype} cannot be sent (numeric dtypes only)")
        specs.append({"dtype": dt, "shape": list(a.shape), "offset": 0})
    # The offsets depend on the header's length, which depends on the offsets' digits: lay out
    # until nothing moves (twice, at most three times).
    while True:
        header = json.dumps({"kind": kind, "meta": meta, "arrays": specs},
                            separators=(",", ":")).encode()
        start = _PREFIX.size + len(header)
        offset = start + _pad(start)
        changed = False
        for s, a in zip(specs, arrs):
            changed |= s["offset"] != offset
            s["offset"] = offset
            offset += a.nbytes + _pad(a.nbytes)
        if not changed:
            break
    buf = bytearray(offset)
    _PREFIX.pack_into(buf, 0, MAGIC, len(header))
    buf[_PREFIX.size:_PREFIX.size + len(header)] = header
    for s, a in zip(specs, arrs):
        if a.nbytes:
            dst = np.frombuffer(buf, dtype=np.uint8, count=a.nbytes, offset=s["offset"])
            dst[:] = a.reshape(-1).view(np.uint8)
    return buf


def _unpack(buf: bytes | bytearray | memoryview) -> tuple[str, dict[str, Any], NDArrays]:
    mv = memoryview(buf)
    if mv.nbytes < _PREFIX.size:
        raise SerdeError(f"corrupt message: {mv.nbytes} bytes is shorter than the 8-byte prefix")
    magic, hlen = _PREFIX.unpack_from(mv, 0)
    if magic != MAGIC:
        raise SerdeError(f"corrupt message: bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if hlen > MAX_HEADER or _PREFIX.size + hlen > mv.nbytes:
        raise SerdeError(f"corrupt message: header length {hlen} exceeds the "
                         f"{mv.nbytes}-byte buffer")
    try:
        head = json.loads(bytes(mv[_PREFIX.size:_PREFIX.size + hlen]))
        kind, meta, specs = head["kind"], head["meta"], head["arrays"]
    except (ValueError, KeyError, TypeError) as e:
        raise SerdeError(f"corrupt message: unreadable header ({e})") from None
    if kind not in _KINDS or not isinstance(meta, dict) or not isinstance(specs, list):
        raise SerdeError(f"corrupt message: unknown kind {kind!r}")
    arrays: NDArrays = []
    for i, s in enumerate(specs):
        try:
            dt, off = _DTYPES.get(s["dtype"]), int(s["offset"])
            shape = tuple(int(d) for d in s["shape"])
        except (KeyError, TypeError, ValueError) as e:
            raise SerdeError(f"corrupt message: array {i}: bad spec ({e})") from None
        if dt is None:
            raise SerdeError(f"corrupt message: array {i}: dtype {s['dtype']!r} is not allowed")
        if any(d < 0 for d in shape):
            raise SerdeError(f"corrupt message: array {i}: negative dimension in {shape}")
        count = math.prod(shape)
        end = off + count * dt.itemsize
        if off < _PREFIX.size + hlen or end > mv.nbytes or off % ALIGN:
            raise SerdeError(f"corrupt message: array {i}: bytes {off}..{end} outside the "
                             f"{mv.nbytes}-byte buffer")
        arrays.append(np.frombuffer(mv, dtype=dt, count=count, offset=off).reshape(shape))
    return kind, meta, arrays


def arrays_to_bytes(arrays: NDArrays) -> bytearray:
    """A list of arrays as one buffer."""
    return _pack("arrays", {}, arrays)


def arrays_from_bytes(buf: bytes | bytearray | memoryview) -> NDArrays:
    """Zero-copy views of the arrays in a buffer made by `arrays_to_bytes`."""
    kind, _, arrays = _unpack(buf)
    if kind != "arrays":
        raise SerdeError(f"corrupt message: expected arrays, got {kind!r}")
    return arrays


def encode(msg: Any) -> bytearray:
    """One message dataclass (FitIns, FitRes, ...) as one buffer."""
    kind = _KIND_OF.get(type(msg))
    if kind is None:
        raise SerdeError(f"cannot encode {type(msg).__name__}")
    cls, array_field = _KINDS[kind]
    meta = {f.name: getattr(msg, f.name) for f in fields(cls) if f.name != array_field}
    arrays = list(getattr(msg, array_field)) if array_field else []
    return _pack(kind, meta, arrays)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def decode(buf: bytes | bytearray | memoryview, expect: type | None = None) -> Any:
    """The message in `buf`; its arrays are views into `buf`. `expect` checks the kind."""
    kind, meta, arrays = _unpack(buf)
    cls, array_field = _KINDS[kind]
    if cls is list:
        raise SerdeError("corrupt message: a bare array list is not a message")
    if expect is not None and cls is not expect and cls is not ErrorRes:
        raise SerdeError(f"corrupt message: expected {_KIND_OF[expect]}, got {kind}")
    unknown = set(meta) - _field_names(cls)
    if unknown:
        raise SerdeError(f"corrupt message: {kind} has unknown fields {sorted(unknown)}")
    if array_field:
        meta = {**meta, array_field: arrays}
    try:
        return cls(**meta)
    except TypeError as e:
        raise SerdeError(f"corrupt message: {kind}: {e}") from None


def chunks(buf: bytes | bytearray | memoryview, size: int) -> Iterator[bytes]:
    """`buf` cut into pieces of at most `size` bytes, for streaming transports."""
    mv = memoryview(buf)
    for start in range(0, mv.nbytes, size):
        yield bytes(mv[start:start + size])


def join_into(pieces: Iterator[bytes], out: bytearray | memoryview) -> int:
    """Write chunks straight into `out` (a preallocated buffer of the announced size); raises
    `SerdeError` unless they fill it exactly. Returns the bytes written."""
    dst = memoryview(out).cast("B")
    total, pos = dst.nbytes, 0
    for p in pieces:
        if pos + len(p) > total:
            raise SerdeError(f"corrupt stream: more than the announced {total} bytes")
        dst[pos:pos + len(p)] = p
        pos += len(p)
    if pos != total:
        raise SerdeError(f"corrupt stream: got {pos} of the announced {total} bytes")
    return pos


def join(pieces: Iterator[bytes], total: int | None = None, *,
         out: bytearray | None = None) -> bytearray:
    """Chunks back into one writable buffer (`out`, an empty bytearray, when given), grown as
    they arrive. An announced `total` is checked against what comes, and never allocated up
    front: a sender that announces more than it sends costs only what it has sent."""
    out = bytearray() if out is None else out
    for p in pieces:
        if total is not None and len(out) + len(p) > total:
            raise SerdeError(f"corrupt stream: more than the announced {total} bytes")
        out += p
    if total is not None and len(out) != total:
        raise SerdeError(f"corrupt stream: got {len(out)} of the announced {total} bytes")
    return out
