"""`plinth fl sim`: a whole federation on one machine, with the real server code.

Virtual clients run in a process pool (`PoolTransport`) or, with `backend="ray"`, as Ray actors
with per-client CPUs and GPU shares (`RayTransport`); every message goes through `serde` as bytes, so the byte counts are those a network would carry. The server evaluates the global model
on the held-out test set after each round.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl.app import AppSpec, load_app, load_code
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.data import client_partitions, load_source
from plinth.fl.messages import Metrics, NDArrays
from plinth.fl.robust.rules import RULES
from plinth.fl.safeguards import Safeguards, root_trainer
from plinth.fl.server import RoundRecord, Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport.inproc import PoolTransport


def initial_model(spec: AppSpec) -> tuple[Any, NDArrays]:
    """The app's model, initialised from the app's seed, and its parameters."""
    import torch

    from plinth.fl.torch_client import get_parameters

    code = load_code(spec)
    torch.manual_seed(spec.seed)
    model = code.make_model(spec)
    return model, get_parameters(model)


def central_evaluator(spec: AppSpec, model: Any) -> Callable[[NDArrays], tuple[float, Metrics]]:
    """Test loss and accuracy; with a backdoor attack, also the backdoor's success rate (the
    share of triggered test images, not already of the target class, classified as the target)."""
    import torch

    from plinth.fl.torch_client import evaluate_model, set_parameters

    _, test = load_source(spec.data, spec.seed)
    attack = spec.attack if spec.attack is not None and spec.attack.kind == "backdoor" else None

    def evaluate(params: NDArrays) -> tuple[float, Metrics]:
        set_parameters(model, params)
        loss, acc = evaluate_model(model, test)
        metrics = {"accuracy": acc}
        if attack is not None:
            from plinth.fl.client import trigger_side
            from plinth.fl.robust.attacks import backdoor_success_rate

            @torch.no_grad()
            def predict(x: np.ndarray) -> np.ndarray:
                model.eval()
                return model(torch.from_numpy(x.astype(test.x.dtype))).argmax(1).numpy()

            metrics["backdoor_success"] = backdoor_success_rate(
                predict, test.x, test.y, side=trigger_side(test.x.shape[1]),
                target=attack.target, patch=attack.patch)
        return loss, metrics

    return evaluate


def make_safeguards(spec: AppSpec, *, simulated: bool = False) -> Safeguards:
    """The app's robust rule, DP, SecAgg and consent settings for a server that holds data;
    `simulated` (`plinth fl sim` only) lets `noise: auto` mean seeded noise."""
    robust = spec.strategy.robust
    root = robust is not None and RULES.get(robust.rule).needs_server_update
    update = root_trainer(spec) if root else None
    return Safeguards(spec, server_update=update, simulated=simulated)


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


def serve_rounds(spec: AppSpec, transport: Any, model: Any, params: NDArrays, *,
                 ckpt: Checkpointer | None, resume: bool,
                 on_round: Callable[[RoundRecord], None] | None,
                 on_start: Callable[[AppSpec, int], None] | None = None,
                 simulated: bool = False) -> tuple[Server, list[RoundRecord]]:
    """The server's whole life on a transport, for `plinth fl sim` and `plinth fl server` alike:
    build it with the app's strategy, evaluator and safeguards, resume or start, run the
    rounds, and close the transport, the safeguards, the strategy (its aggregator tree) and the
    checkpoint whatever happens."""
    strategy = make_strategy(spec.strategy.name, spec.strategy.options,
                             threads=spec.server.aggregation_threads)
    guard = make_safeguards(spec, simulated=simulated)
    try:
        server = Server(strategy, transport, spec.server, seed=spec.seed,
                        evaluate=central_evaluator(spec, model)
                        if spec.server.evaluate == "central" else None, checkpoint=ckpt,
                        safeguards=guard)
        server.initialize(params, resume=resume)
        if on_start is not None:
            on_start(spec, server.start_round)
        return server, server.run(spec.server.rounds, on_round)
    finally:
        transport.close()
        guard.close()
        strategy.close()
        if ckpt is not None:
            ckpt.close()


BACKENDS = ("pool", "ray")


def run_sim(app_path: str, *, clients: int, rounds: int | None = None,
            workers: int | None = None, resume: bool = False,
            overrides: dict[str, Any] | None = None,
            on_round: Callable[[RoundRecord], None] | None = None,
            on_start: Callable[[AppSpec, int], None] | None = None,
            backend: str = "pool", ray_address: str | None = None,
            client_cpus: float = 1.0, client_gpus: float = 0.0) -> dict[str, Any]:
    """Run a simulated federation; returns the summary that `--json` writes.

    `backend` "ray" runs the clients as `workers` Ray actors (default: as many as fit) of
    `client_cpus` CPUs and `client_gpus` GPUs each, on the Ray cluster at `ray_address`
    (HOST:PORT or auto) or on a private local Ray started and stopped here."""
    if backend not in BACKENDS:
        raise PlinthError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "pool" and (ray_address or client_cpus != 1.0 or client_gpus):
        raise PlinthError("--ray-address, --client-cpus and --client-gpus need --backend ray")
    if client_cpus <= 0 or client_gpus < 0 or (client_gpus > 1 and client_gpus % 1):
        raise PlinthError(f"--client-cpus {client_cpus:g} --client-gpus {client_gpus:g}: CPUs "
                          f"must be positive, GPUs a share up to 1 or a whole number")
    ov = {**(overrides or {}), "data.clients": clients, "server.rounds": rounds}
    spec = load_app(app_path, ov)
    ov = {k: v for k, v in ov.items() if v is not None}
    model, params = initial_model(spec)
    train, _ = load_source(spec.data, spec.seed)
    sizes = [len(p) for p in client_partitions(spec.data, train, clients, spec.seed)]
    del train
    ckpt = Checkpointer(spec.resolve(spec.checkpoint_dir)) if spec.checkpoint_dir else None
    sticky = spec.privacy.secagg is not None
    with tempfile.TemporaryDirectory(prefix="plinth-fl-") as tmp:
        state_dir = str(Path(ckpt.dir) / "clients") if ckpt else tmp
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        with _transport(backend, app_path, ov, clients, sizes, workers=workers,
                        state_dir=state_dir, sticky=sticky, ray_address=ray_address,
                        client_cpus=client_cpus, client_gpus=client_gpus) as transport:
            server, records = serve_rounds(spec, transport, model, params, ckpt=ckpt,
                                           resume=resume, on_round=on_round,
                                           on_start=on_start, simulated=True)
    return summary(spec, records, clients, server.stopped)


@contextmanager
def _transport(backend: str, app_path: str, ov: dict[str, Any], clients: int,
               sizes: list[int], *, workers: int | None, state_dir: str, sticky: bool,
               ray_address: str | None, client_cpus: float, client_gpus: float
               ) -> Iterator[Any]:
    """The clients' transport; for Ray, inside a Ray session that ends with it."""
    if backend == "pool":
        yield PoolTransport(app_path, ov, clients, sizes, workers=workers,
                            state_dir=state_dir, sticky=sticky)
        return
    from plinth.fl.transport.ray import RayTransport, ray_session

    # a private Ray gets the CPUs for `workers` actors (else the machine's)
    cpus = math.ceil(workers * client_cpus) if workers else None
    with ray_session(ray_address, num_cpus=cpus):
        yield RayTransport(app_path, ov, clients, sizes, actors=workers,
                           client_cpus=client_cpus, client_gpus=client_gpus,
                           state_dir=state_dir, sticky=sticky)


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
