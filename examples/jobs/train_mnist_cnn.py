"""A small CNN trained on 8x8 digits (scikit-learn's load_digits, or random data without it).

Runs on CUDA when there is a GPU, otherwise on the CPU. Saves a checkpoint every
--checkpoint-every steps and when Plinth asks it to stop, and resumes from the latest one, so a
preempted run continues where it left off. Prints the training rate at the end.

    python examples/jobs/train_mnist_cnn.py --steps 200
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn

from plinth import job


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # same shapes, random labels: the rate is what this example measures
        g = torch.Generator().manual_seed(0)
        return torch.rand(1797, 1, 8, 8, generator=g), torch.randint(0, 10, (1797,), generator=g)
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(d.target, dtype=torch.long)


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (ignored on CUDA)")
    args = ap.parse_args()

    job.init()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, y = (t.to(device) for t in digits())
    net = model().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    start = 0
    if (ckpt := job.load_checkpoint(map_location=device)) is not None:
        state, start = ckpt
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        print(f"resumed from step {start}", flush=True)

    def save(step: int) -> None:
        job.save_checkpoint({"model": net.state_dict(), "opt": opt.state_dict()}, step)

    g = torch.Generator(device="cpu").manual_seed(start)
    t0, step, loss = time.perf_counter(), start, torch.tensor(0.0)
    while step < args.steps:
        if job.should_stop():
            save(step)
            print(f"stopping at step {step}", flush=True)
            return job.STOPPED_EXIT_CODE
        idx = torch.randint(0, len(x), (args.batch,), generator=g).to(device)
        loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % args.checkpoint_every == 0:
            save(step)
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    with torch.no_grad():
        acc = (net(x).argmax(1) == y).float().mean().item()
    save(step)
    print(f"device {device}, {step - start} steps in {dt:.2f}s: {(step - start) / dt:.1f} steps/s, "
          f"loss {loss.item():.3f}, train accuracy {acc:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
