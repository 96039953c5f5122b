"""GPU discovery, --fake-gpus, and the MPS daemon lifecycle (with a stand-in binary)."""

from __future__ import annotations

import os
import stat

import pytest

from plinth.core.errors import SpecError
from plinth.runtime.gpu import (
    GpuInfo,
    MpsManager,
    catalog_model,
    discover_gpus,
    fake_gpus,
    mps_env,
    parse_fake_gpu_groups,
    parse_fake_gpus,
)


@pytest.mark.parametrize(("value", "want"), [("4xA100", (4, "A100")), ("2xh100", (2, "H100")),
                                             (" 1 x A100-40G ", (1, "A100-40G"))])
def test_parse_fake_gpus(value, want):
    assert parse_fake_gpus(value) == want


@pytest.mark.parametrize("value", ["4A100", "xA100", "0xA100", "4xB999", ""])
def test_bad_fake_gpus_name_the_option(value):
    with pytest.raises(SpecError, match="^--fake-gpus: "):
        parse_fake_gpus(value)


@pytest.mark.parametrize(("name", "mem", "want"), [
    ("NVIDIA H200", 143_771, ("H200", True)),
    ("NVIDIA H100 80GB HBM3", 81_559, ("H100", True)),
    ("NVIDIA A100-SXM4-80GB", 81_920, ("A100", True)),
    ("NVIDIA A100-SXM4-40GB", 40_960, ("A100-40G", True)),
    ("Tesla V100-SXM2-16GB", 16_160, ("V100M16", True)),
    ("Tesla T4", 15_360, ("T4", True)),
    ("NVIDIA A10", 23_028, ("A10", True)),
    ("NVIDIA A10G", 23_028, ("A10", False)),  # not in the catalog: nearest in memory
])
def test_catalog_model(name, mem, want):
    assert catalog_model(name, mem) == want


def test_no_gpus_without_nvml():
    gpus = discover_gpus()
    if gpus:
        pytest.skip("this machine has GPUs")
    assert gpus == []


def test_mps_env():
    assert mps_env("/p", 250, 4096) == {"CUDA_MPS_PIPE_DIRECTORY": "/p",
                                        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                                        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}
    assert mps_env("/p", 4, 0)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in mps_env("/p", 500, 0)


STAND_IN = """#!/bin/sh
# Records how it was called, like nvidia-cuda-mps-control would be.
if [ "$1" = "-d" ]; then
  echo "start $CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY" >> "$MPS_CALLS"
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
else
  read cmd
  echo "$cmd $CUDA_VISIBLE_DEVICES" >> "$MPS_CALLS"
  rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
fi
"""


def test_mps_daemon_starts_on_first_use_and_quits_after_last(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text(STAND_IN)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_CALLS", str(calls))
    gpus = [GpuInfo(i, "NVIDIA H200", "H200", 143_360, f"GPU-{i}") for i in range(2)]
    mps = MpsManager(tmp_path / "home", gpus, fake=False)
    assert mps.available
    env = mps.acquire(1, (1, 1, 0), 250, 1000)
    mps.acquire(1, (2, 1, 0), 500, 0)  # a second client shares the daemon
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(mps.pipe_dir(1)) and mps.daemons() == [1]
    assert mps.visible_device(1) == "GPU-1"  # the daemon renumbers devices; UUIDs do not change
    mps.release(1, (1, 1, 0))
    assert mps.daemons() == [1]
    mps.release(1, (2, 1, 0))
    assert mps.daemons() == []
    assert calls.read_text().splitlines() == [f"start GPU-1 {mps.pipe_dir(1)}", "quit GPU-1"]


def test_fake_gpus_never_start_a_daemon(tmp_path):
    mps = MpsManager(tmp_path, [GpuInfo(0, "fake A100", "A100", 81_920)], fake=True)
    env = mps.acquire(0, (1, 1, 0), 500, 0)
    assert not mps.available and "fake" in mps.reason
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and mps.daemons() == []
    assert mps.visible_device(0) == "0"


def test_fake_gpu_groups():
    assert parse_fake_gpu_groups("2xA100,2xv100") == [(2, "A100"), (2, "V100")]
    assert parse_fake_gpu_groups("4xA100") == [(4, "A100")]
    gpus = fake_gpus("2xA100, 1xT4")
    assert [(g.index, g.model) for g in gpus] == [(0, "A100"), (1, "A100"), (2, "T4")]


@pytest.mark.parametrize(("value", "why"), [("2xA100,", "got ''"), ("2xA100,2xA100", "twice"),
                                            ("2xA100,0xV100", "at least 1")])
def test_bad_fake_gpu_groups_name_the_option(value, why):
    with pytest.raises(SpecError, match="^--fake-gpus: ") as e:
        parse_fake_gpu_groups(value)
    assert why in str(e.value)
