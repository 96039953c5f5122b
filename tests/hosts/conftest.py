"""The multi-host bed for these tests: one per session (it takes some 15 s to boot), removed at
the end even when a test fails. Tests that need root skip with the reason elsewhere."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from bed import skip_reason
from cluster import PlinthBed

DEADLINE_S = 180.0  # generous: the machine is shared; tests never assert on time


@pytest.fixture(scope="session")
def plinth_bed():
    why = skip_reason()
    if why:
        pytest.skip(why)
    pb = PlinthBed()
    try:
        yield pb.up()
    finally:
        pb.down()


def wait_for(cond: Callable[[], object], what: str, timeout: float = DEADLINE_S) -> object:
    """Poll `cond` until it returns something truthy; fail naming `what` at the deadline."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
