"""Two (or more) workers training a tiny model with DistributedDataParallel over gloo.

Plinth starts one process per worker with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE set
(torchrun's conventions), so `init_method="env://"` finds the others. Each rank trains on its
own data; DDP averages the gradients, so every rank ends with the same weights. Rank 0 prints an
all-reduced sum that shows every rank took part.

    plinth submit examples/jobs/gang_ddp.yaml          # workers: 2
    torchrun --nproc-per-node 2 examples/jobs/gang_ddp.py
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from plinth import job


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()

    torch.set_num_threads(1)  # the workers share the machine's cores
    # gloo picks its network interface from the host name, which may not resolve inside a
    # sandbox; the workers of the local runtime always meet on loopback.
    if os.environ.get("MASTER_ADDR") == "127.0.0.1":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == job.rank() and world == job.world_size()

    torch.manual_seed(0)  # the same initial weights on every rank
    model = DistributedDataParallel(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)  # but different data
    for _ in range(args.steps):
        x = torch.randn(16, 4, generator=g)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    w = model.module.weight.detach().clone()
    ws = [torch.zeros_like(w) for _ in range(world)]
    dist.all_gather(ws, w)
    if rank == 0:
        same = all(torch.equal(ws[0], o) for o in ws)
        print(f"all_reduce sum = {total.item():g} (expected {world * (world + 1) / 2:g}), "
              f"world {world}, weights equal on all ranks: {same}", flush=True)
    # Tear down together: a rank that closes its connections while a peer is still inside a
    # collective can make gloo abort that peer ("terminate called without an active exception").
    dist.barrier()
    del model
    dist.destroy_process_group()
    # gloo's background threads can still abort the interpreter's own shutdown under load
    # ("terminate called without an active exception", exit 134) after all the work is done;
    # leave at once instead, with everything flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
