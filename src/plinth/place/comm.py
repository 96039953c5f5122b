"""Communication cost model: c(bytes) = a * bytes + b, fitted on measured copies.

`fit` is pure least squares. `measure_copies` is the I/O shell: it times real tensor copies
between two devices (CPU to CPU here; GPU to GPU or host to GPU where those exist).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from plinth.core.errors import SpecError


@dataclass(frozen=True, slots=True)
class CommModel:
    """Time in microseconds to move `bytes` between two devices."""

    a_us_per_byte: float
    b_us: float
    source: str = "given"

    def cost_us(self, nbytes):
        """Cost of a transfer (0 for nothing to send); works on scalars and numpy arrays."""
        nb = np.asarray(nbytes, dtype=np.float64)
        c = np.where(nb > 0, self.a_us_per_byte * nb + self.b_us, 0.0)
        return float(c) if c.ndim == 0 else c

    @property
    def bandwidth_gbps(self) -> float:
        return 1e-3 / self.a_us_per_byte if self.a_us_per_byte > 0 else float("inf")

    def describe(self) -> str:
        return f"{self.bandwidth_gbps:.1f} GB/s + {self.b_us:.1f} µs ({self.source})"


# PCIe 3.0 x16 as measured in practice (about 12 GB/s, 10 µs per copy): the default where no
# copies between two distinct devices can be measured.
PCIE = CommModel(1.0 / 12e3, 10.0, "PCIe 3 x16 preset")
NVLINK = CommModel(1.0 / 150e3, 5.0, "NVLink preset")


def pcie() -> CommModel:
    return PCIE


def nvlink() -> CommModel:
    return NVLINK


def fit(sizes, times_us, *, source: str = "fit") -> CommModel:
    """Least-squares line through (bytes, µs); slope and intercept are kept non-negative."""
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(times_us, dtype=np.float64)
    if x.shape != y.shape or x.size < 2 or np.unique(x).size < 2:
        raise SpecError("comm fit: need at least two distinct sizes with one time each")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise SpecError("comm fit: sizes and times must be finite")
    # Weighted by 1/time: relative errors count, so the small copies pin the fixed cost b and
    # the large ones the per-byte cost a (plain least squares lets the large ones set both).
    a, b = np.polyfit(x, y, 1, w=1.0 / np.maximum(np.abs(y), 1e-9))
    if a <= 0:
        a = float(max(np.mean(y / x), 1e-12))
        b = 0.0
    return CommModel(float(a), float(max(b, 0.0)), source)


def measure_copies(src: str = "cpu", dst: str = "cpu", *,
                   sizes=(1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24),
                   repeats: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Fastest time (µs) of copying a tensor of each size from `src` to `dst`: other work on the
    machine can only slow a copy down, so the minimum is the copy's own cost."""
    s_dev, d_dev = torch.device(src), torch.device(dst)
    times = []
    for n in sizes:
        x = torch.empty(int(n), dtype=torch.uint8, device=s_dev)
        x.fill_(1)
        samples = []
        for _ in range(repeats + 1):
            _sync(s_dev, d_dev)
            t = time.perf_counter()
            y = x.to(d_dev, copy=True)
            _sync(s_dev, d_dev)
            samples.append((time.perf_counter() - t) * 1e6)
            del y
        times.append(min(samples[1:]))
    return np.asarray(sizes, dtype=np.float64), np.asarray(times)


def _sync(*devices: torch.device) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def local_pair() -> tuple[str, str]:
    """The pair of devices whose copies model a transfer here: two GPUs where there are two,
    host and GPU where there is one, otherwise CPU memory to CPU memory."""
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return ("cuda:0", "cuda:1") if n >= 2 else ("cpu", "cuda:0")
    return ("cpu", "cpu")


def measure_local() -> CommModel:
    """Fit the model on copies between the local devices."""
    src, dst = local_pair()
    sizes, times = measure_copies(src, dst)
    return fit(sizes, times, source=f"measured {src}->{dst}")
