"""The dashboard's cost: queue page load time with 10,000 jobs in the store, control-plane CPU
with one open dashboard, and submissions/s and scheduling pass latency with and without one.

    python bench/dashboard.py [--jobs 10000] [--seconds 60] [--submit-jobs 2000] [--json F]

Real `plinth up` processes (SQLite, 8 fake A100s, policy drf) on 127.0.0.1. "An open dashboard"
is a headless Chromium (the system's, driven by Selenium) showing /ui/queue, whose live part
polls every 2 s. Submissions/s and pass latency come from `bench/platform_submit.py`'s
`throughput` (a job holding every GPU first, then the burst) on a fresh server each run,
alternating without and with a dashboard; pass latency is read from the server's own
/metrics histogram. Page loads are timed at the HTTP client (server time plus loopback) and in
the browser (Navigation Timing, to the load event).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from platform_submit import throughput

from plinth.cli.quickstart import kill_jobs, start_server, stop_server
from plinth.client import Client
from plinth.core.net import free_port


@contextmanager
def server():
    home = Path(tempfile.mkdtemp(prefix="plinth-bench-ui-")) / "home"
    port = free_port()
    proc = start_server(home, port, "--fake-gpus", "8xA100", "--min-runtime", "0", "--grace", "1")
    try:
        yield f"http://127.0.0.1:{port}", (home / "token").read_text().strip(), proc
    finally:
        stop_server(proc)
        kill_jobs(home)
        shutil.rmtree(home.parent, ignore_errors=True)


@contextmanager
def dashboard(url: str, token: str, path: str = "/ui/queue"):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
    try:
        driver.get(f"{url}/ui/login")
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.ID, "sign-in").click()
        driver.get(url + path)
        yield driver
    finally:
        driver.quit()


def pass_stats(url: str, token: str) -> tuple[float, float]:
    """(passes, mean pass seconds) from the server's /metrics."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}).text
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
           if s.name.startswith("plinth_scheduler_pass_seconds_") and not s.labels}
    n = got["plinth_scheduler_pass_seconds_count"]
    return n, got["plinth_scheduler_pass_seconds_sum"] / n if n else 0.0


def timed_get(url: str, headers: dict, n: int) -> np.ndarray:
    out = []
    with httpx.Client(headers=headers, timeout=60) as c:
        c.get(url).raise_for_status()  # warm
        for _ in range(n):
            t = time.perf_counter()
            c.get(url).raise_for_status()
            out.append(time.perf_counter() - t)
    return np.array(out) * 1000


def browser_loads(driver, url: str, n: int) -> np.ndarray:
    out = []
    for _ in range(n):
        driver.get(url)
        out.append(driver.execute_script(
            "return performance.getEntriesByType('navigation')[0].duration"))
    return np.array(out)


def cpu_per_minute(pid: int, seconds: float) -> float:
    p = psutil.Process(pid)
    c0 = sum(p.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(p.cpu_times()[:2]) - c0) * 60 / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10000, help="pending jobs in the store")
    ap.add_argument("--seconds", type=float, default=60.0, help="CPU sampling window")
    ap.add_argument("--submit-jobs", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=30, help="page loads timed per page")
    ap.add_argument("--json")
    args = ap.parse_args()
    res: dict = {"load_average_1m_start": psutil.getloadavg()[0]}

    # 1. Submissions/s and pass latency, alternating without and with an open dashboard.
    runs: dict[str, list] = {"without": [], "with": []}
    for mode in ("without", "with", "without", "with"):
        with server() as (url, token, proc):
            if mode == "with":
                with dashboard(url, token):
                    rate, p99, _ = throughput(url, token, args.submit_jobs, args.threads,
                                                proc.pid)
            else:
                rate, p99, _ = throughput(url, token, args.submit_jobs, args.threads, proc.pid)
            passes, mean_pass = pass_stats(url, token)
        runs[mode].append({"submissions_per_s": rate, "submit_p99_ms": p99,
                           "passes": passes, "mean_pass_ms": mean_pass * 1000})
    res["submit"] = runs

    # 2. 10,000 pending jobs: page loads and CPU.
    with server() as (url, token, proc):
        throughput(url, token, args.jobs, args.threads, proc.pid)  # checks all are pending
        with Client(url, token) as c:
            c.set_tenant("other", None, None)
            other = c.add_token("other")
        with Client(url, other) as c:
            c.submit({"name": "mine", "command": ["true"],
                      "resources": {"cpus": 0.01, "memory": "16Mi", "gpus": 1}})
        admin = {"Authorization": f"Bearer {token}"}
        last = -(-args.jobs // 50)
        pages = {
            "/ui/queue (page 1, admin)": (f"{url}/ui/queue", admin),
            f"/ui/queue?page={last} (last page, admin)": (f"{url}/ui/queue?page={last}", admin),
            "/ui/queue/live (the 2 s poll)": (f"{url}/ui/queue/live", admin),
            "/ui/queue (a tenant: scans the queue)": (f"{url}/ui/queue",
                                                      {"Authorization": f"Bearer {other}"}),
            "/ui/cluster": (f"{url}/ui/cluster", admin),
            "/metrics": (f"{url}/metrics", admin),
        }
        res["http_ms"] = {}
        for name, (u, h) in pages.items():
            ms = timed_get(u, h, args.repeat)
            res["http_ms"][name] = {"p50": float(np.median(ms)),
                                    "p95": float(np.percentile(ms, 95))}
        res["cpu_s_per_min_idle"] = cpu_per_minute(proc.pid, args.seconds)
        with dashboard(url, token) as driver:
            ms = browser_loads(driver, f"{url}/ui/queue", max(5, args.repeat // 3))
            res["browser_queue_load_ms"] = {"p50": float(np.median(ms)),
                                            "p95": float(np.percentile(ms, 95))}
            driver.get(f"{url}/ui/queue")
            res["cpu_s_per_min_dashboard"] = cpu_per_minute(proc.pid, args.seconds)
    res["load_average_1m_end"] = psutil.getloadavg()[0]
    res["jobs"] = args.jobs

    con = Console()
    t = Table(title=f"Dashboard with {args.jobs:,} pending jobs in the store (8 fake A100s)")
    t.add_column("measure")
    t.add_column("p50 (ms)", justify="right")
    t.add_column("p95 (ms)", justify="right")
    for name, v in res["http_ms"].items():
        t.add_row(f"GET {name}", f"{v['p50']:.1f}", f"{v['p95']:.1f}")
    b = res["browser_queue_load_ms"]
    t.add_row("Chromium: /ui/queue to the load event", f"{b['p50']:.1f}", f"{b['p95']:.1f}")
    con.print(t)
    t = Table(title=f"Control-plane CPU, {args.seconds:.0f} s windows")
    t.add_column("")
    t.add_column("CPU s per minute", justify="right")
    t.add_column("share of one core", justify="right")
    for k, label in (("cpu_s_per_min_idle", "idle, no dashboard"),
                     ("cpu_s_per_min_dashboard", "one dashboard open on /ui/queue")):
        t.add_row(label, f"{res[k]:.2f}", f"{res[k] / 60:.1%}")
    con.print(t)
    t = Table(title=f"Submissions ({args.submit_jobs:,} jobs, {args.threads} threads) and passes")
    for col in ("dashboard", "submissions/s", "submit p99 (ms)", "passes", "mean pass (ms)"):
        t.add_column(col, justify="right")
    for mode, rs in runs.items():
        for r in rs:
            t.add_row(mode, f"{r['submissions_per_s']:.0f}", f"{r['submit_p99_ms']:.1f}",
                      f"{r['passes']:.0f}", f"{r['mean_pass_ms']:.2f}")
    for mode, rs in runs.items():
        t.add_row(f"{mode}: mean", f"{statistics.fmean(r['submissions_per_s'] for r in rs):.0f}",
                  "", "", f"{statistics.fmean(r['mean_pass_ms'] for r in rs):.2f}")
    con.print(t)
    con.print(f"load average {res['load_average_1m_start']:.1f} at the start, "
              f"{res['load_average_1m_end']:.1f} at the end, on {psutil.cpu_count()} CPUs")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
