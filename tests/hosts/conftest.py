"""The multi-host bed for these tests: one per session (it takes some 15 s to boot), removed at
the end even when a test fails. Tests that need root skip with the reason elsewhere."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from bed import skip_reason
from cluster import PlinthBed


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
