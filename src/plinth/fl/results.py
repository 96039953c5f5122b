"""What a federated task's rounds come to, for `plinth fl sim`, `plinth fl server` and `plinth fl
admm` alike: the summary their `--json` writes (`summary`), the file (`write_json`) and its plots
(`plot`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from plinth.fl.app import AppSpec
    from plinth.fl.server import RoundRecord

# per-round metrics the JSON carries when the app turns the feature on
_ROUND_METRICS = ("epsilon", "dp_clip", "dp_clipped", "dp_noise_std", "local_epsilon",
                  "backdoor_success", "robust_selected", "secagg_survivors", "secagg_dropped",
                  "secagg_aborted", "leaves", "leaf_mbps")


def summary(spec: AppSpec, records: list[RoundRecord], clients: int,
            stopped: str | None = None) -> dict[str, Any]:
    rounds = [{"round": r.round, "accuracy": r.accuracy, "loss": r.loss,
               "seconds": round(r.seconds, 4), "bytes_up": r.bytes_up,
               "bytes_down": r.bytes_down, "updates": r.updates,
               "failures": len(r.failures), "clients": list(r.clients),
               **{k: r.metrics[k] for k in _ROUND_METRICS if k in r.metrics},
               **({"reason": r.reason} if r.reason else {})}
              for r in records]
    accs = [r.accuracy for r in records if r.accuracy is not None]
    extra: dict[str, Any] = {}
    if spec.strategy.robust is not None:
        extra["robust"] = spec.strategy.robust.rule
    if spec.attack is not None:
        extra["attack"] = {"kind": spec.attack.kind, "fraction": spec.attack.fraction}
    if spec.privacy.dp is not None:
        eps = [r.metrics["epsilon"] for r in records if "epsilon" in r.metrics]
        extra["epsilon"] = eps[-1] if eps else 0.0
        extra["delta"] = spec.privacy.dp.delta
        extra["epsilon_budget"] = spec.privacy.dp.epsilon_budget
        extra["dp_mode"] = spec.privacy.dp.mode
    if spec.privacy.local_dp is not None:
        # per client, against the server: a client that uploaded in every round
        eps = [r.metrics["local_epsilon"] for r in records if "local_epsilon" in r.metrics]
        extra["local_epsilon"] = eps[-1] if eps else 0.0
        extra["local_delta"] = spec.privacy.local_dp.delta
        extra["local_epsilon_budget"] = spec.privacy.local_dp.epsilon_budget
    if spec.privacy.secagg is not None:
        extra["secagg"] = True
    if spec.consent is not None:
        extra["consent_purpose"] = spec.consent.purpose
    return {"app": spec.name, "strategy": spec.strategy.name, "clients": clients,
            "compression": spec.compression.kind, **extra, "stopped": stopped,
            "partition": spec.data.partition, "rounds": rounds,
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            "bytes_up": [r.bytes_up for r in records],
            "bytes_down": [r.bytes_down for r in records],
            "total_bytes_up": sum(r.bytes_up for r in records),
            "total_bytes_down": sum(r.bytes_down for r in records),
            "total_seconds": round(sum(r.seconds for r in records), 3)}


def plot(result: dict[str, Any], out: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rs = result["rounds"]
    x = [r["round"] for r in rs]
    paths = []
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    nan = float("nan")
    a1.plot(x, [nan if r["accuracy"] is None else r["accuracy"] for r in rs], marker=".")
    a1.set(xlabel="round", ylabel="test accuracy", title=f"{result['app']} · {result['strategy']}")
    a2.plot(x, [nan if r["loss"] is None else r["loss"] for r in rs], marker=".",
            color="tab:red")
    a2.set(xlabel="round", ylabel="test loss")
    fig.tight_layout()
    paths.append(out / "accuracy.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.bar(x, [r["bytes_up"] / 1e6 for r in rs], label="up")
    ax.bar(x, [r["bytes_down"] / 1e6 for r in rs], bottom=[r["bytes_up"] / 1e6 for r in rs],
           label="down")
    ax.set(xlabel="round", ylabel="MB", title="bytes per round")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "bytes.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write_json(result: dict[str, Any], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=1, default=_jsonable))


def _jsonable(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    raise TypeError(f"cannot write {type(o).__name__} as JSON")
