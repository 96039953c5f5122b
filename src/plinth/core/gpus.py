"""GPU models: memory, SM count and a relative speed (V100 = 1.0) used where no per-job
throughput is known. Speeds are rough FP32/FP16 training ratios from public benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

from plinth.core.errors import SpecError


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_mib: int
    sms: int
    speed: float = 1.0


GPU_CATALOG: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("H200", 143_360, 132, 3.6),
        GpuModel("H100", 81_920, 132, 3.2),
        GpuModel("A100", 81_920, 108, 2.2),
        GpuModel("A100-40G", 40_960, 108, 2.2),
        GpuModel("A10", 24_576, 72, 1.1),
        GpuModel("V100", 32_768, 80, 1.0),
        GpuModel("V100M16", 16_384, 80, 1.0),
        GpuModel("V100M32", 32_768, 80, 1.0),
        GpuModel("T4", 15_360, 40, 0.45),
        GpuModel("P100", 16_384, 56, 0.6),
        GpuModel("K80", 12_288, 13, 0.25),
        # Alibaba's undisclosed internal models (G1..G3): assume V100-class cards.
        GpuModel("G1", 16_384, 80, 1.0),
        GpuModel("G2", 16_384, 80, 1.0),
        GpuModel("G3", 32_768, 80, 1.0),
    )
}


def gpu_model(name: str) -> GpuModel:
    """Look a model up by name, case-insensitively."""
    m = GPU_CATALOG.get(name) or GPU_CATALOG.get(name.upper())
    if m is None:
        known = ", ".join(GPU_CATALOG)
        raise SpecError(f"unknown GPU model {name!r}; known models: {known}")
    return m
