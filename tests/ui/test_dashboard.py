"""The dashboard in a real headless Chromium against a real control plane with fake GPUs.

Each page is checked against the REST API (counts, states, the pending reason text); the cancel
button is clicked and the job is read back from the store; a tenant's token is used to attack
every page and fragment for another tenant's workloads. A screenshot of each page goes to
results/ui/.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from plinth_platform import reachable, tenants_own  # (tests/control, put on the path by conftest)
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from plinth.control.store import Store

APPS = Path(__file__).parents[1] / "fl" / "apps"
# what plinth.job.save_checkpoint reports after a save: the job's detail page shows the step
CHECKPOINT = f"{sys.executable} -c 'from plinth.job import report_checkpoint; report_checkpoint(7)'"


def spec(name: str, command: str, *, gpus: int = 0, fraction: float = 0.0,
         preemptible: bool = False) -> dict:
    res: dict = {"cpus": 0.1, "memory": "256Mi"}
    if fraction:
        res.update(gpu_fraction=fraction, gpu_memory="8Gi")
    else:
        res["gpus"] = gpus
    return {"name": name, "command": command, "resources": res, "preemptible": preemptible}


@pytest.fixture(scope="module")
def world(platform):
    """Two tenants: three jobs running over both nodes, three that cannot start yet."""
    with platform.client() as admin:
        for t in ("alpha", "beta"):
            admin.set_tenant(t, None, None)
        tokens = {t: admin.add_token(t) for t in ("alpha", "beta")}
    with platform.client(tokens["alpha"]) as a, platform.client(tokens["beta"]) as b:
        hog = a.submit(spec("alpha-hog", "sleep 300", gpus=4))
        _until(lambda: a.job(hog)["state"] == "running")
        b_run = b.submit(spec("beta-run", "sleep 300", gpus=2))
        frac = a.submit(spec("alpha-frac", "echo hello-from-frac; sleep 300", fraction=0.5,
                             preemptible=True))
        for c, j in ((b, b_run), (a, frac)):
            _until(lambda c=c, j=j: c.job(j)["state"] == "running")
        a_wait = [a.submit(spec(f"alpha-wait-{i}", "true", gpus=4)) for i in range(2)]
        b_wait = [b.submit(spec("beta-wait", "true", gpus=4))]
        for c, j in [*((a, j) for j in a_wait), (b, b_wait[0])]:
            _until(lambda c=c, j=j: c.job(j)["reason"] not in ("", "queued"))
    return {"tokens": tokens, "alpha": [hog, frac, *a_wait], "beta": [b_run, *b_wait],
            "hog": hog, "frac": frac, "b_run": b_run}


def _until(cond, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)
    return got


def settled(read, tries: int = 20):
    """`read()` of elements that htmx may swap out mid-read (every 2 s): read again."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(tries - 1):
        try:
            return read()
        except StaleElementReferenceException:
            pass
    return read()


def sign_in(driver, platform, token: str) -> None:
    driver.delete_all_cookies()
    driver.get(f"{platform.url}/ui/login")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()
    WebDriverWait(driver, 10).until(EC.url_contains("/ui/cluster"))


def wait(driver, cond, timeout: float = 10.0):
    return WebDriverWait(driver, timeout).until(lambda d: cond(d))


def shot(driver, shots: Path, name: str) -> None:
    driver.save_screenshot(str(shots / f"{name}.png"))


def job_ids(driver, table: str) -> list[int]:
    return [int(r.get_attribute("data-job"))
            for r in driver.find_elements(By.CSS_SELECTOR, f"#{table} tr[data-job]")]


def scrape(platform) -> dict[tuple[str, tuple], float]:
    """/metrics, parsed by prometheus_client's own parser: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{platform.url}/metrics",
                  headers={"Authorization": f"Bearer {platform.token}"})
    assert r.status_code == 200, r.text
    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for fam in text_string_to_metric_families(r.text) for x in fam.samples}


def test_sign_in_refuses_a_bad_token(platform, browser, shots) -> None:
    browser.delete_all_cookies()
    browser.get(f"{platform.url}/ui/queue")
    assert browser.current_url.endswith("/ui/login")  # no cookie: sent to sign in
    browser.find_element(By.ID, "token").send_keys("plt_not-a-token")
    browser.find_element(By.ID, "sign-in").click()
    # the answer is a new page: wait for it (CI once looked before it had loaded)
    WebDriverWait(browser, 10).until(EC.presence_of_element_located((By.ID, "error")))
    assert browser.find_element(By.ID, "error").text == "unknown API token"
    shot(browser, shots, "login")
    r = httpx.get(f"{platform.url}/ui/queue/live", headers={"HX-Request": "true"})
    assert r.status_code == 401  # a fragment without a token: no redirect, no rows


def test_cluster_page_matches_the_api(platform, browser, world, shots) -> None:
    sign_in(browser, platform, platform.token)
    with platform.client() as admin:
        nodes = admin.nodes()
    for n in nodes:
        cells = browser.find_elements(By.CSS_SELECTOR, f'.node[data-node="{n["name"]}"] .gpu')
        assert len(cells) == n["gpus"]
        sm = [float(c.get_attribute("data-sm")) for c in cells]
        assert sm == pytest.approx([(1000 - f) / 1000 for f in n["gpu_free_milli"]])
    used = float(browser.find_element(By.ID, "used-gpus").text)
    assert used == pytest.approx(sum(n["gpus_used"] for n in nodes)) == 6.5
    rows = {r.get_attribute("data-tenant"): r
            for r in browser.find_elements(By.CSS_SELECTOR, "#tenants tr[data-tenant]")}
    assert set(rows) == {"alpha", "beta", "default"}
    assert float(rows["alpha"].find_element(By.CLASS_NAME, "used").text) == 4.5
    assert int(rows["alpha"].find_element(By.CLASS_NAME, "pending").text) == 2
    assert float(rows["beta"].find_element(By.CLASS_NAME, "used").text) == 2.0
    # No quotas configured: drf derives equal shares of the 8 GPUs for the 2 tenants it has
    # seen; alpha holds 4.5 of its 4, as the reason the scheduler gave its fractional job says.
    with platform.client() as admin:
        assert "borrowing 0.5 GPUs" in admin.job(world["frac"])["reason"]
    for name, quota, borrowed in (("alpha", 4.0, 0.5), ("beta", 4.0, 0.0), ("default", 0.0, 0.0)):
        assert float(rows[name].find_element(By.CLASS_NAME, "quota").text) == quota, name
        assert float(rows[name].find_element(By.CLASS_NAME, "borrowed").text) == borrowed, name
    # the fractional job's GPU: half its SMs and 8 GiB of its memory
    half = [c for c in browser.find_elements(By.CSS_SELECTOR, ".gpu")
            if c.get_attribute("data-sm") == "0.500"]
    assert len(half) == 1 and float(half[0].get_attribute("data-mem")) > 0
    shot(browser, shots, "cluster")


def test_queue_page_matches_the_api(platform, browser, world, shots) -> None:
    sign_in(browser, platform, platform.token)
    browser.get(f"{platform.url}/ui/queue")
    with platform.client() as admin:
        live = admin.jobs()
    pending = {j["id"]: j for j in live if j["state"] == "pending"}
    running = {j["id"] for j in live if j["state"] == "running"}
    assert set(job_ids(browser, "pending")) == set(pending) and len(pending) == 3
    assert set(job_ids(browser, "running")) == running == {world["hog"], world["frac"],
                                                           world["b_run"]}
    assert int(browser.find_element(By.ID, "pending-total").text) == 3
    positions = [int(r.find_element(By.TAG_NAME, "td").text)
                 for r in browser.find_elements(By.CSS_SELECTOR, "#pending tr[data-job]")]
    assert positions == [1, 2, 3]

    def reasons_agree(d) -> bool:  # a pass may reword a reason between the two reads
        with platform.client() as admin:
            api = {j: admin.job(j)["reason"] for j in pending}
        shown = {int(r.get_attribute("data-job")): r.find_element(By.CLASS_NAME, "reason").text
                 for r in d.find_elements(By.CSS_SELECTOR, "#pending tr[data-job]")}
        return shown == api and all(api.values())

    wait(browser, reasons_agree)
    shot(browser, shots, "queue")


def test_job_detail_and_cancel(platform, browser, world, shots) -> None:
    frac = world["frac"]
    sign_in(browser, platform, platform.token)
    browser.get(f"{platform.url}/ui/jobs/{frac}")
    with platform.client() as admin:
        api = admin.job(frac)
    assert browser.find_element(By.ID, "state").text == api["state"] == "running"
    kinds = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#events td.kind")]
    assert kinds == [e["kind"] for e in api["events"]] == ["submitted", "started"]
    cells = browser.find_elements(By.CSS_SELECTOR, "#allocation td")
    assert cells[1].text == api["allocation"]["slots"][0]["node_name"]
    assert cells[3].text == "0.5"
    assert json.loads(browser.find_element(By.ID, "spec").text)["name"] == "alpha-frac"
    wait(browser, lambda d: "hello-from-frac" in d.find_element(By.ID, "log-text").text)
    assert browser.find_element(By.ID, "checkpoint").text == "none reported"
    shot(browser, shots, "job")

    browser.find_element(By.ID, "cancel").click()
    WebDriverWait(browser, 5).until(EC.alert_is_present()).accept()
    wait(browser, lambda d: d.find_elements(By.ID, "cancel-result"))
    store = Store(str(platform.home / "plinth.db"))
    try:
        _until(lambda: store.job(frac)["state"] == "cancelled")
        events = store.events(frac)
    finally:
        store.close()
    assert [e["kind"] for e in events][-2:] == ["stop-cancel", "cancelled"]
    # the page's live part follows the job to its end, with the reasons from the store
    wait(browser, lambda d: d.find_element(By.ID, "state").text == "cancelled")
    shown = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")][1:]
             for tr in browser.find_elements(By.CSS_SELECTOR, "#events tr")[1:]]
    assert shown == [[e["kind"], e["message"]] for e in events]
    assert ["stop-cancel", "cancelled by the user"] in shown
    assert not browser.find_elements(By.ID, "cancel")


def test_job_detail_shows_the_last_checkpoint(platform, browser) -> None:
    # The admin's tenant runs as the server's user: a tenant of its own Unix user cannot reach
    # this checkout's Python, nor a jobs folder under /tmp/pytest-of-root.
    with platform.client() as admin:
        j = admin.submit(spec("ckpt", CHECKPOINT + "; sleep 300"))
        _until(lambda: admin.job(j)["checkpoint_step"] == 7)  # the runtime saw the marker
        sign_in(browser, platform, platform.token)
        browser.get(f"{platform.url}/ui/jobs/{j}")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(admin.job(j)["checkpoint_time"]))
        assert browser.find_element(By.ID, "checkpoint").text == f"step 7 at {when}"
        admin.cancel(j)


def test_a_tenant_sees_only_its_own_workloads(platform, browser, world, shots) -> None:
    beta, alpha = world["tokens"]["beta"], world["alpha"]
    sign_in(browser, platform, beta)
    assert "tenant beta" in browser.find_element(By.ID, "who").text
    rows = browser.find_elements(By.CSS_SELECTOR, "#tenants tr[data-tenant]")
    assert [r.get_attribute("data-tenant") for r in rows] == ["beta"]
    browser.get(f"{platform.url}/ui/queue")
    shown = job_ids(browser, "pending") + job_ids(browser, "running")
    assert sorted(shown) == sorted(world["beta"])
    assert "alpha" not in browser.find_element(By.ID, "live").text
    shot(browser, shots, "queue-as-tenant-beta")
    browser.get(f"{platform.url}/ui/jobs/{world['hog']}")
    assert "not found" in browser.page_source and "alpha-hog" not in browser.page_source

    # every page, fragment and action, with beta's token as a cookie or a bearer header
    cookie = {"plinth_token": beta}
    with httpx.Client(base_url=platform.url, cookies=cookie) as http:
        for path in ("/ui/queue", "/ui/queue/live", "/ui/queue/live?page=2", "/ui/cluster",
                     "/ui/cluster/live"):
            r = http.get(path)
            assert r.status_code == 200 and "alpha" not in r.text, path
            assert not any(f'data-job="{j}"' in r.text for j in alpha), path
        for j in alpha:
            for path in (f"/ui/jobs/{j}", f"/ui/jobs/{j}/live", f"/ui/jobs/{j}/log"):
                assert http.get(path).status_code == 404, path
            r = http.post(f"/ui/jobs/{j}/cancel", headers={"HX-Request": "true"})
            assert r.status_code == 404
        assert http.get("/metrics").status_code == 403
    r = httpx.get(f"{platform.url}/metrics", headers={"Authorization": f"Bearer {beta}"})
    assert r.status_code == 403
    with platform.client() as admin:
        assert admin.job(world["hog"])["state"] == "running"


def test_live_parts_poll_no_faster_than_once_a_second(platform, world) -> None:
    import re

    with httpx.Client(base_url=platform.url, cookies={"plinth_token": platform.token}) as http:
        for path in ("/ui/cluster", "/ui/queue", f"/ui/jobs/{world['hog']}", "/ui/services",
                     "/ui/fl"):
            triggers = re.findall(r'hx-trigger="([^"]*)"', http.get(path).text)
            assert triggers, path
            for t in triggers:
                m = re.fullmatch(r"every (\d+(?:\.\d+)?)s", t)
                assert m and float(m.group(1)) >= 1, (path, t)


def test_cancel_needs_the_dashboards_header(platform, world) -> None:
    """A cross-site form can post with the cookie but cannot add HX-Request."""
    r = httpx.post(f"{platform.url}/ui/jobs/{world['hog']}/cancel",
                   cookies={"plinth_token": world["tokens"]["alpha"]})
    assert r.status_code == 403 and "HX-Request" in r.json()["detail"]
    with platform.client() as admin:
        assert admin.job(world["hog"])["state"] == "running"


def test_queue_pages_in_policy_order(platform, browser, world) -> None:
    with platform.client(world["tokens"]["beta"]) as b:
        more = [b.submit(spec(f"beta-more-{i}", "true", gpus=4)) for i in range(60)]
    sign_in(browser, platform, platform.token)
    browser.get(f"{platform.url}/ui/queue")
    wait(browser, lambda d: int(d.find_element(By.ID, "pending-total").text) == 63)
    first = job_ids(browser, "pending")
    assert len(first) == 50
    browser.find_element(By.ID, "next").click()
    wait(browser, lambda d: "page 2 of 2" in d.find_element(By.ID, "pager").text)
    second = job_ids(browser, "pending")
    assert len(second) == 13 and not set(first) & set(second)
    assert set(first) | set(second) == set(more) | set(world["alpha"][2:]) | {world["beta"][1]}
    positions = [int(r.find_element(By.TAG_NAME, "td").text)
                 for r in browser.find_elements(By.CSS_SELECTOR, "#pending tr[data-job]")]
    assert positions == list(range(51, 64))
    with platform.client() as admin:
        for j in more:
            admin.cancel(j)


def test_simulations_page_shows_the_cli_results(platform, browser, shots, tmp_path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("job_id,submit_time,duration,num_gpus\n" + "".join(
        f"j{i},{i * 60},{600 + 300 * (i % 7)},{1 + i % 4}\n" for i in range(40)))
    out = tmp_path / "sim.json"
    subprocess.run([sys.executable, "-m", "plinth.cli.main", "sim", "--trace", str(trace),
                    "--cluster", "2x4xV100", "--compare", "fifo,sjf", "--json", str(out),
                    "--out", str(tmp_path / "plots")], check=True, capture_output=True)
    rows = json.loads(out.read_text())
    sign_in(browser, platform, platform.token)
    browser.get(f"{platform.url}/ui/simulations")
    browser.find_element(By.ID, "file").send_keys(str(out))
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#sim img.plot"))
    table = browser.find_element(By.CSS_SELECTOR, "#sim pre.rich").text
    for r in rows:
        line = next(x for x in table.splitlines() if f" {r['policy']} " in x)
        assert f"{r['avg_jct_s'] / 3600:,.2f}" in line and f"{r['gpu_utilization']:.1%}" in line
    assert len(browser.find_elements(By.CSS_SELECTOR, "#sim img.plot")) == 2
    assert not browser.find_elements(By.ID, "no-series")
    shot(browser, shots, "simulations")

    bad = tmp_path / "bad.json"
    bad.write_text('{"policy": "fifo"}')
    browser.find_element(By.ID, "file").send_keys(str(bad))
    wait(browser, lambda d: d.find_elements(By.ID, "error"))
    error = browser.find_element(By.ID, "error").text
    assert error.startswith("sim results: expected a non-empty list") and "\n" not in error


@pytest.mark.slow  # a real federated run: 3 rounds of 4 clients (about 20 s)
def test_fl_page_shows_a_federated_run(platform, browser, shots, tmp_path) -> None:
    import yaml

    app = yaml.safe_load((APPS / "tiny.yaml").read_text())
    app |= {"code": str(APPS / "tiny.py"),
            "privacy": {"dp": {"noise_multiplier": 1.0, "epsilon_budget": 100}}}
    (tmp_path / "dp.yaml").write_text(yaml.safe_dump(app))
    out = tmp_path / "fl.json"
    subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "sim",
                    str(tmp_path / "dp.yaml"), "--clients", "4", "--rounds", "3", "--workers",
                    "1", "--json", str(out)], check=True, capture_output=True)
    doc = json.loads(out.read_text())
    sign_in(browser, platform, platform.token)
    browser.get(f"{platform.url}/ui/fl")
    browser.find_element(By.ID, "file").send_keys(str(out))
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#rounds tr td"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#rounds tr")[1:]
    assert len(rows) == len(doc["rounds"]) == 3
    for tr, r in zip(rows, doc["rounds"], strict=True):
        cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        assert cells[0] == str(r["round"]) and cells[1] == f"{r['accuracy']:.4f}"
        assert cells[2] == f"{r['loss']:.4f}" and cells[7] == f"{r['epsilon']:.3f}"
        assert cells[4] == str(len(r["clients"])) and cells[6] == str(r["failures"])
    assert browser.find_element(By.ID, "epsilon").text == f"{doc['epsilon']:.4f}"
    assert browser.find_element(By.ID, "epsilon-budget").text == "100"
    assert 0 < doc["epsilon"] < 100 and doc["epsilon_budget"] == 100
    assert len(browser.find_elements(By.CSS_SELECTOR, "#fl img.plot")) == 2
    shot(browser, shots, "fl")


def test_services_page_lists_a_tenants_services_live(platform, world, browser, shots) -> None:
    # An SLO the router's own hop breaks (the model alone takes under 1 ms here), so that the
    # autoscaler (aiad, a tick a second) scales up under a few requests and back down after.
    service = {"kind": "Service", "name": "digits", "model": "tiny-cnn",
               "input_shape": [784], "slo_ms": 3,
               "resources": {"cpus": 0.1, "memory": "1Gi"}, "min_replicas": 1,
               "max_replicas": 2}
    alpha = world["tokens"]["alpha"]
    with platform.client(alpha) as a:
        a.submit_workload(service)
        _until(lambda: a.workload("digits")["status"].get("ready") == 1, 120)
        w = a.workload("digits")  # with the address its router reported
    sign_in(browser, platform, alpha)
    browser.get(f"{platform.url}/ui/services")
    sel = '#services tr[data-service="digits"]'
    row = browser.find_element(By.CSS_SELECTOR, sel)
    assert row.find_element(By.CLASS_NAME, "replicas").text == "1 / 1"
    assert w["status"]["url"] in row.text and "3 ms" in row.text
    # Requests through the router show up on the page without a reload (htmx polls it), and
    # so do the autoscaler's decisions with their reasons: up to 2 under load, then back to 1.
    for _ in range(20):
        httpx.post(w["status"]["url"], json={"inputs": [[0.0] * 784]}, timeout=30)
    with platform.client(alpha) as a:
        def calm() -> dict | None:
            st = a.workload("digits")["status"]
            done = [(d["from"], d["to"]) for d in st.get("decisions", [])][:2] == [(1, 2), (2, 1)]
            return st if done and st["desired"] == st["ready"] == 1 else None
        st = _until(calm, 120)
    assert st["decisions"][0]["reason"].startswith("aiad: 1 over the SLO")

    def page_agrees(d) -> bool:
        r = d.find_element(By.CSS_SELECTOR, sel)
        shown = [li.text for li in d.find_elements(By.CSS_SELECTOR, "#services ul.decisions li")]
        return (r.find_element(By.CLASS_NAME, "replicas").text == "1 / 1"
                and len(shown) == len(st["decisions"])
                and all(f"{x['from']} → {x['to']}, {x['reason']}" in line for x, line in
                        zip(reversed(st["decisions"]), shown, strict=True))
                and f"{100 * st['slo_attainment']:.1f}%" in r.text
                and d.find_element(By.CSS_SELECTOR, "#services div.reason").text
                == f"why 1: {st['reason']}")

    wait(browser, lambda d: settled(lambda: page_agrees(d)), 30)
    assert "replica-0" in browser.find_element(By.ID, "services").text
    assert settled(lambda: browser.find_element(  # replicas over time
        By.CSS_SELECTOR, f"{sel} svg polyline").get_attribute("points"))
    shot(browser, shots, "services")
    m = scrape(platform)
    for state in ("desired", "ready"):
        assert m[("plinth_service_replicas", (("service", "digits"), ("state", state)))] == 1
    sign_in(browser, platform, world["tokens"]["beta"])  # another tenant sees none of it
    browser.get(f"{platform.url}/ui/services")
    assert browser.find_elements(By.ID, "no-services")
    with httpx.Client(base_url=platform.url, cookies={"plinth_token": world["tokens"]["beta"]}) \
            as http:
        for path in ("/ui/services", "/ui/services/live"):
            r = http.get(path)
            assert r.status_code == 200 and "digits" not in r.text and "alpha" not in r.text
        with platform.client(alpha) as a:
            units = [u["job_id"] for u in a.workload("digits")["units"]]
        for j in units:
            assert http.get(f"/ui/jobs/{j}").status_code == 404
    with platform.client(alpha) as a:
        a.cancel_workload("digits")


@pytest.mark.slow  # a real FL task: its server a job of the platform, 2 client processes
def test_fl_page_shows_a_live_task_to_its_tenant_only(platform, world, browser, shots,
                                                      tmp_path) -> None:
    import yaml

    tokens = tmp_path / "tokens.txt"
    subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "tokens", str(tokens),
                    "--clients", "2"], check=True, capture_output=True)
    doc = yaml.safe_load((APPS / "tiny.yaml").read_text())
    doc |= {"kind": "FLTask", "name": "live-fl", "code": str(APPS / "tiny.py"),
            "resources": {"cpus": 0.1, "memory": "1Gi"}, "transport": {"tokens": str(tokens)}}
    doc["data"]["clients"] = 2
    # the LIFL tree (leaf aggregator processes sized each round) and local DP with a budget
    doc["server"] |= {"rounds": 3, "min_clients": 2, "min_available": 2,
                      "aggregation": {"mode": "tree", "max_leaves": 2}}
    doc["privacy"] = {"local_dp": {"noise_multiplier": 1.0, "epsilon_budget": 1000}}
    app = tmp_path / "app.yaml"
    app.write_text(yaml.safe_dump(doc))
    # As root, the admin's tenant runs as its own Unix user, who must read the tokens file
    # made here (0600), as it would had it written it itself.
    tenants_own(tokens)
    reachable(tmp_path)
    with platform.client() as a:
        a.submit_workload(app)
        # its server, which reports where it listens, then the tree's leaf units beside it
        _until(lambda: a.workload("live-fl")["status"].get("address"), 120)
        clients = [subprocess.Popen(
            [sys.executable, "-m", "plinth.cli.main", "fl", "client", str(app), "--server",
             a.workload("live-fl")["status"]["address"], "--cid", str(i), "--token",
             line.split()[1]],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for i, line in enumerate(tokens.read_text().splitlines())]
        try:
            _until(lambda: a.workload("live-fl")["state"] == "succeeded", 300)
            api = a.workload("live-fl")["status"]
        finally:
            for c in clients:
                c.kill()
    sign_in(browser, platform, platform.token)
    browser.get(f"{platform.url}/ui/fl")
    task = 'section.fltask[data-task="live-fl"]'
    assert settled(lambda: browser.find_element(By.CSS_SELECTOR, f"{task} .round").text) \
        == str(api["round"]) == "3"
    shown = settled(lambda: [[td.text for td in r.find_elements(By.TAG_NAME, "td")] for r in
                             browser.find_elements(By.CSS_SELECTOR, f"{task} table.rounds tr")[1:]])
    rounds = list(reversed(api["per_round"]))
    assert [r[:7] for r in shown] == [
        [str(p["round"]), f"{p['accuracy']:.4f}", f"{p['loss']:.4f}", "2", "0",
         f"{p['epsilon']:.3f}", str(int(p["leaves"]))] for p in rounds]
    assert all(p["leaves"] >= 1 for p in rounds)  # the tree's size, as its server reported it
    eps = [p["epsilon"] for p in api["per_round"]]
    assert eps == sorted(eps) and 0 < eps[-1] == api["epsilon"] < 1000  # spent, under budget
    head = browser.find_element(By.CSS_SELECTOR, f"{task} h2")
    assert head.find_element(By.CLASS_NAME, "epsilon").text == f"{api['epsilon']:.3f}"
    assert head.find_element(By.CLASS_NAME, "epsilon-budget").text == "1000"
    shot(browser, shots, "fl-task")
    m = scrape(platform)  # one round-time sample a round; the last round's participants
    assert m[("plinth_fl_round_seconds_count", (("task", "live-fl"),))] == 3
    assert m[("plinth_fl_round_participants", (("outcome", "updated"), ("task", "live-fl")))] == 2
    assert m[("plinth_fl_round_participants", (("outcome", "failed"), ("task", "live-fl")))] == 0
    sign_in(browser, platform, world["tokens"]["beta"])
    browser.get(f"{platform.url}/ui/fl")
    assert not browser.find_elements(By.CSS_SELECTOR, 'section.fltask[data-task="live-fl"]')
    with httpx.Client(base_url=platform.url, cookies={"plinth_token": world["tokens"]["beta"]}) \
            as http:
        for path in ("/ui/fl", "/ui/fl/live"):
            r = http.get(path)
            assert r.status_code == 200 and "live-fl" not in r.text, path
