"""Like with like: `plinth serve sim` as production runs, and set up as Faro's own simulator.

    python bench/serve_fidelity.py [--seeds 0,1,2] [--cpus 32,36] [--procs 2] [--json PATH]
                                   [--minutes START:END] [--setups plinth,faro-sim]
                                   [--compressed] [--resume] [--traces DIR]

Replays the 10-job Twitter trace (jobs10_6h) under each policy, seed and quota, in two setups:

- `plinth`: what the platform runs. The router's queueing (fewest in flight, 4 per replica, a
  queue per replica), the measured cold start of a real replica (`COLD_START_S`), each minute's
  count at uniform random times, the project's service-time fit (resnet34_latency_lognorm.yaml).
- `faro-sim`: Faro's simulator as its 10-job experiment configures it (beomyeol/faro
  @ b595c4ad): round-robin routing, a 35 s cold start, Poisson arrivals at each minute's rate,
  the lognormal of `job_latency_specs.yaml` (`faro-10job`).

Each row is the mean SLO violation rate over the seeds (with its spread), next to Faro's committed
simulator results for the same policy (the mean over its 5 seeds of 1 − avg_total_slo_rate,
from `results/faro/resnet34-sim/top9_twitter…/latency_stats.pkl`). `--compressed` adds the
time-compressed replay that the real serving path can run in minutes: the first 2 jobs on
8 CPUs, one trace minute in 6 s (`--compress 10`), the whole 6 hours and the first 60 minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from plinth.serve.policies import make_policy
from plinth.serve.sim import COLD_START_S, FARO_COLD_START_S, SimConfig, simulate
from plinth.serve.traces import SERVICE_FITS, load_counts, load_service_time

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared/data/traces/faro-twitter"
POLICIES = ["faro-fairsum", "aiad", "oneshot", "mark", "ray-serve", "fairshare"]
SETUPS = {
    "plinth": {"queueing": "router", "cold_start_s": COLD_START_S, "arrivals": "uniform",
               "service": "resnet34_latency_lognorm.yaml"},
    "faro-sim": {"queueing": "round-robin", "cold_start_s": FARO_COLD_START_S,
                 "arrivals": "poisson", "service": "faro-10job"},
}
# Faro's committed simulator results, 10-job trace, mean over seeds 24, 32, 40, 42, 62.
# (Faro's fair share ran 3 replicas per job, 30 CPUs, at both quotas; ours hands out all.)
FARO_SIM = {32: {"faro-fairsum": 0.031, "faro-sum": 0.051, "faro-fair": 0.033, "aiad": 0.095,
                 "oneshot": 0.369, "mark": 0.142, "fairshare": 0.163},
            36: {"faro-fairsum": 0.013, "faro-sum": 0.014, "faro-fair": 0.014, "aiad": 0.072,
                 "oneshot": 0.322, "mark": 0.035, "fairshare": 0.163}}
# Faro's real-cluster runs (the paper), for reference only: not what a simulator compares with.
FARO_REAL = {32: {"faro-fairsum": 0.053, "aiad": 0.142}, 36: {"faro-fairsum": 0.028,
                                                            "aiad": 0.094}}


def one(args: tuple) -> dict:
    traces, setup, cpus, policy, seed, minutes, jobs, compress = args
    s = SETUPS[setup]
    name = s["service"]
    svc = load_service_time(name if name in SERVICE_FITS else Path(traces) / name)
    tr = load_counts(Path(traces) / "jobs10_6h.jsonl")
    if minutes:
        tr = tr.window(*minutes)
    if jobs:
        tr = tr.first_jobs(jobs)
    cfg = SimConfig(service=svc, quota=cpus, cold_start_s=s["cold_start_s"],
                    queueing=s["queueing"], arrivals=s["arrivals"], compress=compress, seed=seed)
    r = simulate(tr, make_policy(policy), cfg)
    return dict(r.row(), setup=setup, cpus=cpus, seed=seed, minutes=tr.minutes,
                jobs=len(tr.jobs), service_fit=s["service"], **{
                    k: v for k, v in cfg.label().items() if k not in ("service", "seed")})


def markdown(rows: list[dict], setups: list[str], cpus_list: list[int],
             policies: list[str]) -> str:
    """One row per setup and quota: the mean violation rate over the seeds run, per policy."""
    out = ["| setup | CPUs | seeds | " + " | ".join(policies) + " | best baseline ÷ Faro |",
           "|---|---|---|" + "---:|" * (len(policies) + 1)]
    for setup in setups:
        for cpus in cpus_list:
            got = [r for r in rows if r["setup"] == setup and r["cpus"] == cpus
                   and r["compress"] == 1.0]
            # Only the seeds every policy has run, so each mean is over the same replays.
            have = [{r["seed"] for r in got if r["policy"] == p} for p in policies]
            seeds = sorted(set.intersection(*have)) if have else []
            got = [r for r in got if r["seed"] in seeds]
            if not got:
                continue
            means = {p: statistics.fmean(r["slo_violation_rate"] for r in got
                                         if r["policy"] == p) for p in policies}
            cells = [f"{means[p]:.4f}" for p in policies]
            base = [v for p, v in means.items() if not p.startswith("faro")]
            ratio = (f"{min(base) / means['faro-fairsum']:.2f}×" if base and
                     "faro-fairsum" in means else "–")
            out.append(f"| {setup} | {cpus} | {len(seeds)} | " + " | ".join(cells)
                       + f" | {ratio} |")
            if setup == "faro-sim" and cpus in FARO_SIM:
                ref = [f"{FARO_SIM[cpus][p]:.3f}" if p in FARO_SIM[cpus] else "–"
                       for p in policies]
                fs = FARO_SIM[cpus]
                best = min(v for p, v in fs.items() if not p.startswith("faro"))
                out.append(f"| Faro's simulator | {cpus} | 5 | " + " | ".join(ref)
                           + f" | {best / fs['faro-fairsum']:.2f}× |")
    return "\n".join(out)


def _key(r: dict) -> tuple:
    return (r["setup"], r["cpus"], r["policy"], r["seed"], r["minutes"], r["jobs"],
            float(r["compress"]))


def _key_of(w: tuple) -> tuple:
    _, setup, cpus, policy, seed, minutes, jobs, compress = w
    return (setup, cpus, policy, seed, 360 if minutes is None else minutes[1] - minutes[0],
            jobs or 10, float(compress))


def _minutes(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    a, b = text.split(":")
    return int(a), int(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=str(TRACES))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cpus", default="32,36")
    ap.add_argument("--setups", default="plinth,faro-sim")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--minutes", default=None, help="part of the trace, START:END")
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--compressed", action="store_true")
    ap.add_argument("--resume", action="store_true", help="skip the runs in the .runs.jsonl")
    ap.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args()
    if not (Path(args.traces) / "jobs10_6h.jsonl").exists():
        sys.exit(f"{args.traces}: no jobs10_6h.jsonl (pass --traces DIR)")
    seeds = [int(s) for s in args.seeds.split(",")]
    cpus_list = [int(c) for c in args.cpus.split(",")]
    setups = args.setups.split(",")
    policies = args.policies.split(",")
    minutes = _minutes(args.minutes)
    work = []
    if args.compressed:
        work += [(args.traces, "plinth", 8, p, 0, w, 2, 10.0) for p in ("faro-fairsum", "aiad")
                 for w in (None, (0, 60))]
    # Seed by seed, so a benchmark stopped early still covers every setup with its first seeds.
    work += [(args.traces, s, c, p, seed, minutes, None, 1.0)
             for seed in seeds for s in setups for c in cpus_list for p in policies]
    rows = []
    progress = Path(args.json_path).with_suffix(".runs.jsonl") if args.json_path else None
    if progress:
        progress.parent.mkdir(parents=True, exist_ok=True)
        if args.resume and progress.exists():  # keep the runs already done
            rows = [json.loads(line) for line in progress.read_text().splitlines() if line]
            done = {_key(r) for r in rows}
            work = [w for w in work if _key_of(w) not in done]
        else:
            progress.write_text("")
    if args.resume and args.procs == 0:  # report only
        work = []
    with ProcessPoolExecutor(max(args.procs, 1)) as pool:
        # One line per finished run, so a long benchmark leaves its results as it goes.
        for row in pool.map(one, work):
            rows.append(row)
            if progress:
                with progress.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    console = Console(width=120)
    for setup in setups:
        for cpus in cpus_list:
            got = [r for r in rows if r["setup"] == setup and r["cpus"] == cpus
                   and r["compress"] == 1.0]
            if not got:
                continue
            g0 = got[0]
            t = Table(title=f"{setup}: 10 jobs × {g0['minutes']} min, {cpus} CPUs · cold start "
                            f"{g0['cold_start_s']:g} s, queueing {g0['queueing']}, arrivals "
                            f"{g0['arrivals']}, service {g0['service_fit']}, seeds "
                            f"{args.seeds}")
            for col in ("policy", "SLO viol. (mean)", "spread", "Faro's simulator", "p99 s",
                        "dropped", "replay s"):
                t.add_column(col, justify="left" if col == "policy" else "right")
            for p in policies:
                rs = [r for r in got if r["policy"] == p]
                if not rs:
                    continue
                v = [r["slo_violation_rate"] for r in rs]
                ref = FARO_SIM.get(cpus, {}).get(p)
                t.add_row(p, f"{statistics.fmean(v):.4f}",
                          f"{min(v):.4f}-{max(v):.4f}" if len(v) > 1 else "-",
                          f"{ref:.3f}" if ref is not None and setup == "faro-sim" else "",
                          f"{statistics.fmean(r['p99_latency_s'] for r in rs):.2f}",
                          f"{statistics.fmean(r['dropped'] for r in rs):,.0f}",
                          f"{statistics.fmean(r['wall_s'] for r in rs):.0f}")
            console.print(t)
            means = {p: statistics.fmean(r["slo_violation_rate"] for r in got
                                         if r["policy"] == p)
                     for p in policies if any(r["policy"] == p for r in got)}
            base = {p: v for p, v in means.items() if not p.startswith("faro")}
            if "faro-fairsum" in means and base:
                best = min(base, key=base.get)
                console.print(f"best baseline ({best}) / faro-fairsum = "
                              f"{base[best] / max(means['faro-fairsum'], 1e-12):.2f}×")
    comp = [r for r in rows if r["compress"] != 1.0]
    if comp:
        t = Table(title="compressed replay (plinth setup): first 2 jobs, 8 CPUs, --compress 10 "
                        "(a trace minute in 6 s; latencies in compressed seconds)")
        for col in ("policy", "trace minutes", "replay (real) min", "SLO viol.", "p50 s",
                    "p99 s", "dropped"):
            t.add_column(col, justify="left" if col == "policy" else "right")
        for r in comp:
            t.add_row(r["policy"], str(r["minutes"]), f"{r['minutes'] / 10:.0f}",
                      f"{r['slo_violation_rate']:.4f}", f"{r['p50_latency_s']:.3f}",
                      f"{r['p99_latency_s']:.3f}", f"{r['dropped']:,}")
        console.print(t)
    if args.markdown:
        print(markdown(rows, setups, cpus_list, policies))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps({"runs": rows, "faro_sim": FARO_SIM,
                                                    "faro_real": FARO_REAL}, indent=2) + "\n")
        console.print(f"results: {args.json_path}")


if __name__ == "__main__":
    main()
