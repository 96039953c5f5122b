"""`plinth serve`: replay traces against the autoscaling policies, or serve a real model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from plinth.core.errors import SpecError

app = typer.Typer(help="SLO-aware inference autoscaling (Faro) and model serving.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()

# The Faro Twitter traces are data, not part of the package: `sim` finds them in the folder
# named by $PLINTH_TRACES (e.g. ../shared/data/traces) when --trace / --service-time are left out.
TRACES_ENV = "PLINTH_TRACES"
DEFAULT_TRACE = "faro-twitter/jobs10_6h.jsonl"
DEFAULT_SERVICE = "faro-twitter/resnet34_latency_lognorm.yaml"


def _in_traces(option: str, name: str) -> str:
    root = os.environ.get(TRACES_ENV)
    if not root:
        raise SpecError(f"{option}: name a file, or set {TRACES_ENV} to the folder of traces "
                        f"that holds {name}")
    path = Path(root).expanduser() / name
    if not path.is_file():
        raise SpecError(f"{option}: {path} does not exist ({TRACES_ENV} is {root})")
    return str(path)


def _window(text: str | None) -> tuple[int, int | None]:
    if not text:
        return 0, None
    try:
        a, b = text.split(":")
        return int(a or 0), (int(b) if b else None)
    except ValueError:
        raise SpecError(f"--minutes: {text!r} is not START:END in minutes, e.g. 0:120") from None


@app.command()
def sim(
    trace: Annotated[str | None, typer.Option(
        help=f"Per-minute count trace (Faro JSONL, or Azure LLM CSV) (default: "
             f"${TRACES_ENV}/{DEFAULT_TRACE}).")] = None,
    service_time: Annotated[str | None, typer.Option(
        help=f"Service-time fit: a YAML file, or faro-10job (the fit of Faro's 10-job "
             f"experiment) (default: ${TRACES_ENV}/{DEFAULT_SERVICE}).")] = None,
    slo_ms: Annotated[float, typer.Option(help="Latency SLO per request (ms).")] = 720.0,
    cpus: Annotated[int, typer.Option(help="Quota: replicas in all (1 CPU each).")] = 32,
    policy: Annotated[str, typer.Option(help="Policy (see `plinth serve policies`).")] =
    "faro-fairsum",
    compare: Annotated[str | None, typer.Option(help="More policies, p1,p2,…")] = None,
    minutes: Annotated[str | None, typer.Option(help="Part of the trace, START:END.")] = None,
    jobs: Annotated[int | None, typer.Option(help="Only the first N jobs.")] = None,
    quantile: Annotated[float, typer.Option(help="Faro's forecast quantile.")] = 0.6,
    cold_start_s: Annotated[float | None, typer.Option(
        "--cold-start-s", "--cold-start",
        help="Replica cold start (s) (default: the measured start of a real replica, "
             "plinth.serve.sim.COLD_START_S; Faro's simulator uses 35).")] = None,
    queueing: Annotated[str, typer.Option(
        help="router (the platform's: fewest in flight, 4 per replica, a queue per replica), "
             "round-robin (Faro's router) or fifo (one central queue).")] = "router",
    arrivals: Annotated[str, typer.Option(
        help="uniform (each minute's count at uniform random times) or poisson (a Poisson "
             "process at the minute's rate).")] = "uniform",
    compress: Annotated[float, typer.Option(
        help="Time compression c: a trace minute lasts 60/c s, service times, SLO and control "
             "periods shrink by c, the cold start stays real (e.g. 10: 60 s -> 6 s).")] = 1.0,
    hop: Annotated[str | None, typer.Option(
        help="Hop times measured on the real path (JSON list of seconds, in the replay's "
             "seconds): each request adds one, drawn at random (default: none).")] = None,
    initial_replicas: Annotated[int | None, typer.Option(
        help="Replicas each job starts with (default: its fair share of --cpus, as in Faro's "
             "experiments; the platform starts a service at its min_replicas).")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    json_path: Annotated[str | None, typer.Option("--json", help="Write results JSON.")] = None,
    out: Annotated[str | None, typer.Option(help="Folder for plots.")] = "results/serve",
) -> None:
    """Replay a trace under one or more autoscaling policies and compare them."""
    from plinth.serve import report
    from plinth.serve.policies import POLICIES, make_policy
    from plinth.serve.sim import COLD_START_S, SimConfig, load_hops, simulate
    from plinth.serve.traces import load_service_time, load_trace

    if not 0.0 < quantile < 1.0:
        raise SpecError(f"--quantile: {quantile} must lie strictly between 0 and 1")
    names = [policy] + [p.strip() for p in (compare or "").split(",") if p.strip()]
    # --quantile is Faro's; the baselines have no forecast to take it.
    policies = [make_policy(n, **({"quantile": quantile} if POLICIES.check(n).startswith("faro")
                                  else {})) for n in names]
    trace = trace or _in_traces("--trace", DEFAULT_TRACE)
    tr = load_trace(trace).window(*_window(minutes))
    if jobs is not None:
        tr = tr.first_jobs(jobs)
    service_time = service_time or _in_traces("--service-time", DEFAULT_SERVICE)
    cfg = SimConfig(service=load_service_time(service_time), slo_s=slo_ms / 1000.0, quota=cpus,
                    cold_start_s=COLD_START_S if cold_start_s is None else cold_start_s,
                    queueing=queueing, arrivals=arrivals, compress=compress, seed=seed,
                    hop_s=load_hops(hop) if hop else (), initial_replicas=initial_replicas)
    console.print(f"[bold]{len(tr.jobs)} jobs × {tr.minutes} min[/bold] from {trace}; "
                  f"{cpus} CPUs, SLO {slo_ms:g} ms, service mean {cfg.service.mean * 1000:.0f} ms")
    console.print(f"cold start {cfg.cold_start_s:g} s, queueing {queueing}, arrivals {arrivals}, "
                  f"service {service_time}, seed {seed}, hops {cfg.label()['hop_s']}"
                  + (f", compressed {compress:g}x (latencies in compressed seconds)"
                     if compress != 1 else ""), style="dim")
    results = []
    for p in policies:
        results.append(simulate(tr, p, cfg))
        console.print(f"{p.name}: {results[-1].wall_s:.1f} s", style="dim")
    console.print(report.table(results, f"{Path(trace).name} · {cpus} CPUs"))
    if json_path:
        report.write_json(results, json_path, {"cpus": cpus, "trace": Path(trace).name,
                                               "service_fit": service_time, **cfg.label()})
        console.print(f"results: {json_path}")
    if out:
        for path in report.plot(results, out):
            console.print(f"plot: {path}")


@app.command()
def policies() -> None:
    """List the autoscaling policies."""
    from plinth.serve.policies import POLICIES

    for name in POLICIES:
        policy = POLICIES.make(name)
        doc = (policy.__doc__ or "").strip().splitlines()
        line = doc[0] if doc else ""
        if hasattr(policy, "objective"):
            line = (f"Faro, {policy.objective} objective"
                    f"{', with request dropping' if policy.drop else ''}: {line}")
        console.print(f"[bold]{name:18}[/bold] {line}")
