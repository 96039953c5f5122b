"""`plinth sim`, `plinth demo` and `plinth policies`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from plinth.core.errors import SpecError
from plinth.sim import report

console = report.console()


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


def _run(jobs, cluster, policies, cfg, alibaba, title, json_path, out):
    from plinth.sim.run import compare

    with _progress() as bar:
        tasks: dict[str, object] = {}

        def tick(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done)  # type: ignore[arg-type]

        results, rows = compare(jobs, cluster, policies, cfg, alibaba=alibaba, on_progress=tick)
    console.print(report.table(rows, title))
    full = with_series(rows, results) if json_path or out else rows
    if json_path:
        report.write_json(full, json_path)
        console.print(f"results: {json_path}")
    if out:
        report.write_json(full, Path(out) / "results.json")
        for p in report.plot(results, out):
            console.print(f"plot: {p}")
    return rows


def with_series(rows: list[dict], results: list, points: int = 200) -> list[dict]:
    """The rows with the data behind the two plots (JCT quantiles, and the GPUs allocated at up
    to `points` event times), so that a `--json` file alone can be plotted, as the dashboard's
    Simulations page does."""
    import numpy as np

    from plinth.sim.metrics import jct_values

    out = []
    for row, r in zip(rows, results, strict=True):
        jct = np.sort(jct_values(r))
        q = np.linspace(0.0, 1.0, min(points, jct.size)) if jct.size else np.zeros(0)
        pick = np.unique(np.linspace(0, r.util_times.size - 1, min(points, r.util_times.size))
                         .astype(int))
        out.append({**row, "series": {
            "jct_s": np.quantile(jct, q).tolist() if jct.size else [],
            "jct_fraction": q.tolist(),
            "util_t_s": r.util_times[pick].tolist(),
            "util_used_gpus": r.util_used[pick].tolist(),
            "total_gpus": r.cluster.total_gpus}})
    return out


def _policy_list(policy: str, compare_list: str | None) -> list[str]:
    from plinth.sched.policies import POLICIES

    names = [p.strip() for p in (compare_list or policy).split(",") if p.strip()]
    for n in names:
        if n.lower() not in POLICIES:
            raise SpecError(f"--policy: unknown policy {n!r}; choose one of: {', '.join(POLICIES)}")
    return names


def sim(
    trace: Annotated[str, typer.Option(help="Trace file.")],
    cluster: Annotated[str, typer.Option(help="Cluster: YAML spec, Alibaba node-list CSV, "
                                               "or shorthand like 32x8xV100.")],
    format: Annotated[str, typer.Option(help="philly | alibaba | csv")] = "csv",
    policy: Annotated[str, typer.Option(help="Policy name (see `plinth policies`).")] = "fifo",
    compare_: Annotated[str | None, typer.Option("--compare", help="p1,p2,… side by side.")] = None,
    window: Annotated[str | None, typer.Option(
        help="Part of the trace, from its first job: 20d:23d (3,185 Philly jobs).")] = None,
    placement: Annotated[str, typer.Option(help="bestfit | fgd (fractional GPUs).")] = "bestfit",
    throughputs: Annotated[str | None, typer.Option(
        help="Job type x GPU model throughputs: Gavel's simulation_throughputs.json or a CSV "
             "job_type,<model>,...; default: the built-in matrix.")] = None,
    rounds: Annotated[str, typer.Option(
        help="Round (lease) length in seconds for gavel and themis, as Gavel's "
             "--time_per_iteration; 'off' recomputes the allocation at every event.")] = "360",
    json_path: Annotated[str | None, typer.Option("--json", help="Write results JSON.")] = None,
    out: Annotated[str | None, typer.Option(help="Folder for plots and results.")] = "results/sim",
) -> None:
    """Replay a trace under one or more scheduling policies."""
    import plinth.control.kinds  # noqa: F401  # a --cluster YAML of another kind is named as such
    from plinth.core.spec import load_cluster
    from plinth.core.throughput import DEFAULT_THROUGHPUTS, Throughputs
    from plinth.sim.run import check_job_types, parse_rounds, sched_config
    from plinth.sim.traces import load_trace

    names = _policy_list(policy, compare_)
    round_s = parse_rounds(rounds)
    thr = Throughputs.load(throughputs) if throughputs else DEFAULT_THROUGHPUTS
    spec = load_cluster(cluster)
    tr = load_trace(trace, format, window=window)
    check_job_types(tr.jobs, thr, trace)
    cfg = sched_config(placement, tr.jobs, round_s=round_s, throughputs=thr)
    console.print(f"[bold]{len(tr.jobs):,} jobs[/bold] from {trace} on {spec.describe()}")
    if throughputs:
        console.print(f"throughputs: {thr.describe()}")
    _run(tr.jobs, spec, names, cfg, format == "alibaba", f"{Path(trace).name} · {placement}",
         json_path, out)


def demo(
    out: Annotated[str, typer.Option(help="Folder for plots and results.")] = "results/demo",
    jobs: Annotated[int, typer.Option(help="Synthetic jobs to generate.")] = 1500,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Every policy on a bundled synthetic workload, on a small heterogeneous cluster."""
    from plinth.core.spec import load_cluster
    from plinth.sched.policies import POLICIES
    from plinth.sim.run import sched_config
    from plinth.sim.traces.synthetic import synthetic_jobs

    spec = load_cluster("4x8xV100,2x8xP100,2x8xK80")
    # A gang runs on one GPU model, so the largest gang is the largest pool of one model.
    largest = max(spec.gpus_of_model(m) for m in spec.models)
    work = synthetic_jobs(jobs, seed=seed, load=1.3, cluster_gpus=largest, tenants=3)
    console.print(f"[bold]Plinth demo[/bold]: {len(work):,} synthetic jobs (seed {seed}) "
                  f"on {spec.describe()}")
    _run(work, spec, list(POLICIES), sched_config(), False, "all policies, synthetic workload",
         str(Path(out) / "results.json"), out)


def policies() -> None:
    """List the scheduling policies."""
    import importlib

    from plinth.sched.policies import POLICIES

    for name, target in POLICIES.items():
        module, cls = target.split(":")
        try:
            doc = (getattr(importlib.import_module(module), cls).__doc__ or "").strip()
        except ImportError:
            doc = "(not available)"
        console.print(f"[bold]{name:9}[/bold] {doc.splitlines()[0] if doc else ''}")
