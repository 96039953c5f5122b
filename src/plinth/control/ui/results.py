"""Result files opened in the dashboard: `plinth sim --json` and `plinth fl sim --json`.

Each is checked at the boundary (a one-line error names what is wrong) and shown with the CLI's
own table and plots: the simulator's table is `plinth.sim.report.table` rendered by rich, the
FL plots are `plinth.fl.results.plot`'s files. Plots are inline images, so the page needs no files
on the server.
"""

from __future__ import annotations

import base64
import io
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console

from plinth.core.errors import SpecError
from plinth.core.spec import errors_message
from plinth.sim import report


class SimSeries(BaseModel):
    jct_s: list[float]
    jct_fraction: list[float]
    util_t_s: list[float]
    util_used_gpus: list[float]
    total_gpus: int


class SimRow(BaseModel):
    model_config = ConfigDict(extra="allow")
    policy: str
    jobs: int
    series: SimSeries | None = None  # written by `plinth sim --json` since the dashboard


class FLRound(BaseModel):
    model_config = ConfigDict(extra="allow")
    round: int
    accuracy: float | None = None
    loss: float | None = None
    seconds: float
    bytes_up: int = 0
    bytes_down: int = 0
    clients: list[str] = []
    updates: int = 0
    failures: int = 0
    reason: str = ""


class FLResult(BaseModel):
    model_config = ConfigDict(extra="allow")
    app: str
    strategy: str
    rounds: list[FLRound]
    final_accuracy: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    epsilon_budget: float | None = None
    local_epsilon: float | None = None  # local DP: per client, against the server
    local_delta: float | None = None
    local_epsilon_budget: float | None = None
    stopped: str | None = None


def _check(model: type[BaseModel], data: Any, what: str) -> Any:
    try:
        if model is SimRow:
            if not isinstance(data, list) or not data:
                raise SpecError(f"{what}: expected a non-empty list of result rows "
                                f"(plinth sim --json), got {type(data).__name__}")
            return [SimRow.model_validate(r) for r in data]
        return model.model_validate(data)
    except ValidationError as e:
        raise SpecError(errors_message(what, e.errors(), model)) from None


def _png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _figure_png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def sim_view(data: Any) -> dict[str, Any]:
    """The CLI's results table (as HTML) and its two plots, from a `plinth sim --json` file."""
    rows = _check(SimRow, data, "sim results")
    plain = [r.model_dump(exclude={"series"}) for r in rows]
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(report.table(plain))
    table = console.export_html(inline_styles=True, code_format="<pre class=rich>{code}</pre>")
    with_series = [r for r in rows if r.series is not None]
    plots = _sim_plots(with_series) if with_series else []
    return {"table": table, "plots": plots, "policies": [r.policy for r in rows],
            "missing_series": len(with_series) < len(rows)}


def _sim_plots(rows: list[SimRow]) -> list[str]:
    """The CLI's JCT CDF and utilisation plots (`plinth.sim.report.plot`), from the series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    out = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        s = r.series
        if s.jct_s:  # type: ignore[union-attr]
            ax.plot([x / 3600 for x in s.jct_s], s.jct_fraction, label=r.policy)  # type: ignore
    ax.set_xscale("log")
    # Within a decade or two matplotlib labels every minor tick as 3×10⁻¹ and the labels
    # overlap: label 1, 2 and 5 of each decade, as plain numbers.
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 5.0)))
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set(xlabel="job completion time (hours)", ylabel="fraction of jobs", title="JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    out.append(_figure_png(fig))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        s = r.series
        ax.step([t / 3600 for t in s.util_t_s], [u / s.total_gpus for u in s.util_used_gpus],  # type: ignore
                where="post", label=r.policy, lw=1.0)
    ax.set(xlabel="time (hours)", ylabel="GPUs allocated (fraction)", ylim=(0, 1.05),
           title="GPU utilisation over time")
    ax.grid(alpha=0.3)
    ax.legend()
    out.append(_figure_png(fig))
    plt.close(fig)
    return out


def fl_view(data: Any) -> dict[str, Any]:
    """Accuracy and loss per round, participants and failures, and ε against δ, from a
    `plinth fl sim --json` file, with `plinth.fl.results.plot`'s plots."""
    # Here, not at the top: plinth.fl.results may bring the FL aggregation engine, whose numba
    # kernels are compiled with an on-disk cache at import, and `plinth up` must start where its
    # user has no place for one (as `nobody`); only this page needs it.
    from plinth.fl.results import plot

    result = _check(FLResult, data, "fl results")
    with tempfile.TemporaryDirectory(prefix="plinth-ui-") as d:
        plots = [_png(p) for p in plot(result.model_dump(), d)]
    return {"result": result, "plots": plots}
