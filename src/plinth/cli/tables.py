"""The tables `plinth ls`, `plinth nodes` and `plinth quickstart` print: FL tasks, services and
nodes (jobs: `plinth.cli.platform.jobs_table`)."""

from __future__ import annotations

from rich.table import Table


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}ms" if x >= 10 else f"{x:.1f}ms"


def fl_table(ws: list[dict]) -> Table:
    """FL tasks as `plinth ls` lists them: round, last accuracy, participants and failures of
    the last round, privacy spent, and the address clients connect to."""
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("FLTASK", "TENANT", "STATE", "ROUND", "ACCURACY", "CLIENTS", "FAILED", "EPSILON",
                "ADDRESS"):
        t.add_column(col, no_wrap=True, justify="right" if col in (
            "ROUND", "ACCURACY", "CLIENTS", "FAILED", "EPSILON") else "left")
    for w in ws:
        st = w["status"]
        acc = (st.get("per_round") or [{"accuracy": None}])[-1]["accuracy"]
        t.add_row(w["name"], w["tenant"], w["state"], f"{st.get('round', 0)}/{st.get('rounds')}",
                  "-" if acc is None else f"{acc:.4f}", str(st.get("participants", "-")),
                  str(st.get("failures", "-")),
                  "-" if st.get("epsilon") is None else f"{st['epsilon']:.3g}",
                  st.get("address", ""))
    return t


def services_table(ws: list[dict], *, wide: bool = False) -> Table:
    """Services as `plinth ls` lists them under the jobs: replicas desired / ready, request
    rate, p99 against the SLO, SLO attainment."""
    t = Table(box=None, header_style="bold", pad_edge=False)
    cols = ["SERVICE", "TENANT", "STATE", "REPLICAS", "RATE", "P99", "SLO", "IN SLO"]
    for col in [*cols, *(["URL"] if wide else [])]:
        t.add_column(col, justify="right" if col in ("REPLICAS", "RATE", "P99", "SLO",
                                                      "IN SLO") else "left", no_wrap=True)
    for w in ws:
        st, spec_slo = w["status"], None
        if w["kind"] == "Service":
            spec_slo = st.get("slo_ms")
        attained = st.get("slo_attainment")
        row = [w["name"], w["tenant"], w["state"],
               f"{st.get('desired', '-')}/{st.get('ready', 0)}",
               f"{st.get('rate_rps', 0):g}/s", ms(st.get("p99_ms")), ms(spec_slo),
               "-" if attained is None else f"{100 * attained:.1f}%"]
        t.add_row(*row, *([st.get("url", "")] if wide else []))
    return t


def nodes_table(nodes: list[dict]) -> Table:
    t = Table(box=None, header_style="bold")
    for col in ("NODE", "GPU", "GPUS", "GPU SHARES FREE", "CPUS", "MEMORY", "JOBS"):
        t.add_column(col)
    for n in nodes:
        shares = " ".join(f"{m / 1000:.2f}" for m in n["gpu_free_milli"])
        t.add_row(n["name"], n["gpu_model"] or "-", f"{n['gpus_used']:g}/{n['gpus']}", shares,
                  f"{n['cpus_used']:g}/{n['cpus']:g}",
                  f"{n['memory_used_mib'] / 1024:.1f}/{n['memory_mib'] / 1024:.1f} GiB",
                  ",".join(map(str, n["running"])) or "-")
    return t
