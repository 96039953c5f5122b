"""A unit that cannot bind its node's address (PLINTH_NODE_ADDRESS names an address this host
does not have: 198.51.100.7, a documentation range) ends with one line that names the address
and says where it came from, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).parents[1] / "fl" / "apps" / "tiny.yaml"
NOWHERE = "198.51.100.7"


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "plinth.tune.tracker"],
    [sys.executable, "-m", "plinth.cli.main", "fl", "server", str(APP), "--no-tokens"],
], ids=["tune-tracker", "fl-server"])
def test_a_unit_whose_node_address_is_not_here_says_so_in_one_line(argv):
    env = {**os.environ, "PLINTH_NODE_ADDRESS": NOWHERE, "PLINTH_JOB_ID": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if "cannot listen" in line]
    assert len(ours) == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert NOWHERE in ours[0] and "PLINTH_NODE_ADDRESS" in ours[0], ours
