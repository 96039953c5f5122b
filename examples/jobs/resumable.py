"""Counts steps slowly, checkpointing after each one, and resumes from its checkpoint.

The smallest demonstration that a preempted job loses nothing: stop it (SIGTERM), start it
again with the same PLINTH_CHECKPOINT_DIR, and it prints "resumed from step N" and goes on.

    PLINTH_CHECKPOINT_DIR=/tmp/ck python examples/jobs/resumable.py --steps 20
"""

from __future__ import annotations

import argparse
import sys
import time

from plinth import job


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sleep", type=float, default=0.2, help="seconds per step")
    args = ap.parse_args()

    job.init()
    state, step = job.load_checkpoint() or ({"total": 0}, 0)
    if step:
        print(f"resumed from step {step} (attempt {job.attempt()})", flush=True)
    while step < args.steps:
        if job.should_stop():
            print(f"stopping at step {step}", flush=True)
            return job.STOPPED_EXIT_CODE
        time.sleep(args.sleep)
        step += 1
        state["total"] += step
        job.save_checkpoint(state, step)
        print(f"step {step}", flush=True)
    print(f"done at step {step}, total {state['total']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
