"""The runtime contract suite (test_contract.py), run on the Ray runtime on a real 2-node Ray
cluster on 127.0.0.1: the same tests, with the `harness` fixture giving a RayHarness."""

from __future__ import annotations

import pytest
from contract_harness import RayHarness
from test_contract import *

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture
def harness(ray_cluster, tmp_path):
    h = RayHarness(tmp_path, ray_cluster.address)
    try:
        yield h
        h.check_invariants()
    finally:
        h.close()
