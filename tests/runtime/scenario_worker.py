"""A worker that acts out a contract-test Scenario (see contract_harness.py) with the job SDK.

    python scenario_worker.py SCENARIO_JSON REPORT_DIR

It takes its own rank's part of the scenario, installs its SIGTERM behaviour, writes the
environment it got to REPORT_DIR/env-RANK.json (which also tells the harness that it is ready:
a stop from then on finds the handler in place), reports checkpoints at the given seconds, and at
`duration_s` exits with `exit_code`, or vanishes: kills its shim and itself, so that no exit code
is left. A stop it honours ends it at once with job.STOPPED_EXIT_CODE.

Standalone on purpose (plain dicts, only plinth.job imported), so that it starts fast.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from plinth import job

TICK_S = 0.01


def main(argv: list[str]) -> int:
    scenario, report_dir = json.loads(argv[0]), argv[1]
    me = scenario["ranks"].get(str(job.rank()), scenario)
    if me["ignore_term"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stopping = _never
    else:
        job.init()
        stopping = job.should_stop
    _write_json(os.path.join(report_dir, f"env-{job.rank()}.json"), dict(os.environ))
    t0 = time.monotonic()
    for at, step in me["checkpoints"]:
        if not _sleep_until(t0 + at, stopping):
            return job.STOPPED_EXIT_CODE
        job.report_checkpoint(step)
    if not _sleep_until(t0 + me["duration_s"], stopping):
        return job.STOPPED_EXIT_CODE
    if me["vanish"]:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the shim too: nothing writes an exit code
    return int(me["exit_code"])


def _never() -> bool:
    return False


def _sleep_until(t: float, stopping) -> bool:
    """Wait until monotonic time `t`; False as soon as a stop is asked for."""
    while not stopping():
        left = t - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, TICK_S))
    return False


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
