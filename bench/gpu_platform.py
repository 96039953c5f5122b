"""The platform on a real GPU: MPS fractional sharing against running one at a time, and the
MPS memory limit. Needs an NVIDIA GPU with the driver and `nvidia-cuda-mps-control`.

    python bench/gpu_platform.py [--steps 3000] [--json F]

1. Starts `plinth up` (GPUs found by NVML) on 127.0.0.1.
2. Runs 4 copies of examples/jobs/train_mnist_cnn.py at gpu_fraction 0.25 (MPS, 25% of the SMs
   each) together, then the same 4 one after another on the whole GPU.
3. Reports each phase's aggregate training steps/s: together, the sum of the four jobs' own
   rates; one at a time, the mean of their rates (one job runs at any moment). Target: >= 3.5x.
4. Submits a job with a 1 GiB MPS memory limit that allocates 4 GiB, and checks it is refused.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from plinth.cli.quickstart import start_server, stop_server  # noqa: E402
from plinth.core.net import free_port  # noqa: E402
from plinth.client import Client  # noqa: E402

RATE = re.compile(r"device (\S+), (\d+) steps in ([\d.]+)s: ([\d.]+) steps/s")
OOM = ("import torch; x = torch.empty(4 * 2**30, dtype=torch.uint8, device='cuda'); "
       "print('allocated 4 GiB: the limit did not hold')")


def train(steps: int, resources: dict) -> dict:
    return {"name": "cnn", "command": ["python", "examples/jobs/train_mnist_cnn.py", "--steps",
                                       str(steps), "--checkpoint-every", str(10 * steps)],
            "resources": {"cpus": 1, "memory": "8Gi", **resources}}


def rates(c: Client, ids: list[int]) -> list[float]:
    out = []
    for j in ids:
        if c.wait(j, timeout=900) != "succeeded":
            raise SystemExit(f"job {j} failed:\n{c.logs(j)[-2000:]}")
        m = RATE.search(c.logs(j))
        if m is None or m.group(1) != "cuda":
            raise SystemExit(f"job {j} did not train on CUDA:\n{c.logs(j)[-2000:]}")
        out.append(float(m.group(4)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--json")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="plinth-gpu-")) / "home"
    port = free_port()
    proc = start_server(home, port, "--min-runtime", "0")
    try:
        with Client(f"127.0.0.1:{port}", (home / "token").read_text().strip()) as c:
            h = c.health()
            t0 = time.time()
            shared = [c.submit(train(args.steps, {"gpu_fraction": 0.25, "gpu_memory": "8Gi"}))
                      for _ in range(4)]
            together = rates(c, shared)
            t1 = time.time()
            alone = []
            for _ in range(4):
                alone += rates(c, [c.submit(train(args.steps, {"gpus": 1}))])
            t2 = time.time()
            oom = c.submit({"name": "over-limit", "command": ["python", "-c", OOM],
                            "resources": {"cpus": 1, "memory": "8Gi", "gpu_fraction": 0.25,
                                          "gpu_memory": "1Gi"}})
            refused = c.wait(oom, timeout=300) == "failed" and "out of memory" in c.logs(oom)
            oom_log = c.logs(oom)[-600:]
    finally:
        stop_server(proc)
    agg_together, agg_alone = sum(together), sum(alone) / len(alone)
    res = {"gpus": h["gpus"], "steps": args.steps, "together_rates": together,
           "alone_rates": alone, "together_aggregate": agg_together,
           "alone_aggregate": agg_alone, "speedup": agg_together / agg_alone,
           "together_wall_s": t1 - t0, "alone_wall_s": t2 - t1, "over_limit_refused": refused}
    t = Table(title=f"4 CNN training jobs on one GPU ({args.steps} steps each)")
    for col in ("mode", "per-job steps/s", "aggregate steps/s", "wall s"):
        t.add_column(col)
    t.add_row("together, gpu_fraction 0.25 (MPS)", " ".join(f"{r:.0f}" for r in together),
              f"{agg_together:.0f}", f"{t1 - t0:.1f}")
    t.add_row("one after another, whole GPU", " ".join(f"{r:.0f}" for r in alone),
              f"{agg_alone:.0f}", f"{t2 - t1:.1f}")
    console = Console()
    console.print(t)
    console.print(f"speed-up {res['speedup']:.2f}x (target >= 3.5x); a job over its 1 GiB MPS "
                  f"memory limit refused: {refused}")
    if not refused:
        console.print(oom_log)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
