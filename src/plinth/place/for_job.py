"""The platform's placement step for a job whose spec asks for a model-parallel placement.

The control plane starts such a job as ``python -m plinth.place.for_job -- COMMAND...`` with
``PLINTH_PLACEMENT`` holding the request (model factory, algorithm, batch, memory per device).
This computes the plan for the GPUs the job was given (the entries of CUDA_VISIBLE_DEVICES),
writes it to ``$PLINTH_CHECKPOINT_DIR/placement.json`` (a restarted attempt on as many GPUs
reuses it), and then becomes COMMAND with ``PLINTH_PLACEMENT_PLAN`` pointing at the plan, which
the job loads with ``plinth.place.Plan.load`` and applies with ``plinth.place.apply``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def gpu_count(env: dict[str, str]) -> int:
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return max(1, len(visible))


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: python -m plinth.place.for_job -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    request = json.loads(os.environ["PLINTH_PLACEMENT"])
    devices = gpu_count(dict(os.environ))
    memory = int(request["memory_bytes"])
    out = Path(os.environ.get("PLINTH_CHECKPOINT_DIR") or ".") / "placement.json"
    out.parent.mkdir(parents=True, exist_ok=True)  # made here, as the job's user
    key = {**request, "devices": devices}
    plan = None
    if out.exists():
        from plinth.place import Plan

        saved = json.loads(out.read_text())
        if saved.get("request") == key:
            plan = Plan.load(out.with_suffix(".plan.json"))
            print(f"plinth: reusing the placement plan in {out}", flush=True)
    if plan is None:
        from plinth.place.factory import plan_target

        plan = plan_target(request["model"], devices=devices, memory_bytes=memory,
                           algo=request["algo"], batch=int(request["batch"]),
                           on_note=lambda n: print(f"plinth: note: {n}", flush=True))
        plan.save(out.with_suffix(".plan.json"))
        out.write_text(json.dumps({"request": key, "plan": str(out.with_suffix(".plan.json"))}))
        print(f"plinth: placed {request['model']} on {devices} devices with {plan.algo} in "
              f"{plan.placement_time_s:.3f} s; predicted step {plan.predicted_step_time_s:.4f} s; "
              f"peak memory {[round(b / 2**30, 2) for b in plan.peak_memory_bytes]} GiB",
              flush=True)
    os.environ["PLINTH_PLACEMENT_PLAN"] = str(out.with_suffix(".plan.json"))
    sys.stdout.flush()
    os.execvp(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
