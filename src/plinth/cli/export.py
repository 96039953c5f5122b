"""`plinth export`: a platform run as a trace for `plinth sim`, as `sacct` reads Slurm's accounting.

It asks the control plane, like every other command (`--server`, `--token`): a tenant's token
exports that tenant's jobs, an admin token every tenant's and the quotas. See
`plinth.control.export` for what is written and how run times are measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from plinth.cli.platform import Server, Token, connect, console
from plinth.core.errors import PlinthError, SpecError
from plinth.core.lifecycle import State

err = Console(stderr=True)
API_LIMIT = 10000  # the most jobs `GET /v1/workloads` returns at once
NOTES_SHOWN = 20


def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="Trace CSV to write (read by "
                                                         "`plinth sim --format csv`).")]
    = Path("platform-trace.csv"),
    cluster_out: Annotated[Path | None, typer.Option(
        help="Cluster YAML to write, with the tenants' quotas \\[default: OUT.cluster.yaml].")]
    = None,
    meta_out: Annotated[Path | None, typer.Option(
        help="Sidecar JSON: policy, scheduler config, the columns the CSV has not, and what "
             "the platform measured \\[default: OUT.meta.json].")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant's "
                                                                      "jobs.")] = None,
    min_runtime: Annotated[float | None, typer.Option(
        help="The `plinth up --min-runtime` the platform runs with; the API does not report "
             "it \\[default: 30, as plinth up].")] = None,
    round_s: Annotated[float | None, typer.Option(
        "--round", help="The `plinth up --round` the platform runs with (lease length of the "
                        "round-based policies) \\[default: 360, as plinth up].")] = None,
    server: Server = None, token: Token = None,
) -> None:
    """Export finished jobs as a trace, with the cluster, to replay with `plinth sim`."""
    from plinth.client import ApiError
    from plinth.control import export as ex
    from plinth.core.spec import dump_cluster_yaml
    from plinth.sim.traces.csv import write_csv

    if min_runtime is not None and min_runtime < 0:
        raise SpecError(f"--min-runtime: must be >= 0, got {min_runtime:g}")
    if round_s is not None and round_s <= 0:
        raise SpecError(f"--round: must be > 0 seconds, got {round_s:g}")
    cluster_out = cluster_out or out.with_suffix(".cluster.yaml")
    meta_out = meta_out or out.with_suffix(".meta.json")
    notes: list[str] = []
    with connect(server, token) as c:
        health = c.health()
        rows = c.jobs(all=True, tenant=tenant, limit=API_LIMIT)
        if len(rows) == API_LIMIT:
            notes.append(f"only the newest {API_LIMIT} jobs were read (the API's limit)")
        records = [c.job(r["id"]) if State(r["state"]).terminal else r for r in rows]
        nodes = c.nodes()
        try:
            tenants = c.tenants()
        except ApiError as e:
            if e.status != 403:
                raise
            tenants = None
            notes.append("tenants' quotas need an admin token: the cluster is written "
                         "without them")
        where = c.server
    exp = ex.build_export(records)
    if not exp.jobs:
        whose = f" of tenant {tenant}" if tenant else ""
        raise PlinthError(f"nothing to export: none of the {len(rows)} jobs{whose} at {where} "
                          f"has run and finished"
                          + (f" ({exp.left_out[0]})" if exp.left_out else ""))
    # The API does not report the scheduler's config (yet): a value the control plane reports
    # wins, then the option, then `plinth up`'s default, and the sidecar says which it was.
    values, how = {}, []
    for key, option, given, default in (("min_runtime_s", "--min-runtime", min_runtime,
                                         ex.PLATFORM_MIN_RUNTIME_S),
                                        ("round_s", "--round", round_s, ex.PLATFORM_ROUND_S)):
        if key in health:
            values[key], why = float(health[key]), "reported by the control plane"
            if given is not None and given != values[key]:
                notes.append(f"{option} {given:g} ignored: the control plane reports "
                             f"{values[key]:g}")
        elif given is not None:
            values[key], why = given, "given"
        else:
            values[key], why = default, "assumed: plinth up's default"
        how.append(f"{option} {values[key]:g} ({why})")
    config = ex.replay_config(exp, values["min_runtime_s"], values["round_s"])
    source = ", ".join(how)
    cluster = ex.cluster_from_api(nodes, tenants)
    policy = health["policy"]
    try:
        write_csv([m.job for m in exp.jobs], str(out))
        cluster_out.write_text(dump_cluster_yaml(cluster), encoding="utf-8")
        meta_out.write_text(json.dumps(ex.meta(exp, policy=policy, config=config, source=where,
                                               config_source=source), indent=1) + "\n",
                            encoding="utf-8")
    except OSError as e:
        raise PlinthError(f"cannot write {e.filename}: {e.strerror}") from None
    for note in [*notes, *exp.left_out[:NOTES_SHOWN]]:
        err.print(f"note: {note}", highlight=False, soft_wrap=True)
    if len(exp.left_out) > NOTES_SHOWN:
        err.print(f"note: ... and {len(exp.left_out) - NOTES_SHOWN} more jobs left out",
                  highlight=False, soft_wrap=True)
    console.print(f"exported {len(exp.jobs)} of {len(rows)} jobs to {out}; cluster "
                  f"({cluster.describe()}) to {cluster_out}; policy {policy} and scheduler "
                  f"config ({source}) to {meta_out}", highlight=False, soft_wrap=True)
    # `plinth sim` reads the trace and the cluster; what only the sidecar holds (priorities,
    # estimates, CPUs and memory, the scheduler config) `plinth.control.export.replay` applies.
    console.print(f"replay: plinth sim --trace {out} --format csv --cluster {cluster_out} "
                  f"--policy {policy} (without the sidecar: see plinth.control.export.replay)",
                  highlight=False, soft_wrap=True)
