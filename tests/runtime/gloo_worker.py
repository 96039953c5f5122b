"""A torch.distributed worker for the 2-node Ray gang test: it joins the gang over gloo from the
environment the runtime gave it, all-reduces rank+1, and writes what it got to OUT_DIR/RANK.json.

    python gloo_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main(out_dir: str) -> int:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    report = {"sum": t.item(), "rank": dist.get_rank(), "world": dist.get_world_size(),
              "env": {k: os.environ[k] for k in keys}}
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"{report['rank']}.json"), "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
