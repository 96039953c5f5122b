"""The Service controller's units, outside the control plane (a `LocalContext`): its router comes
first, its replicas only once the router has reported where it listens, and they go with it; the
autoscaler's windows come from the router's counters, which a restart of the control plane does
not count twice."""

from __future__ import annotations

from plinth.core.kinds import LocalContext, Observed, Workload
from plinth.core.lifecycle import State
from plinth.serve.reports import RouterReport
from plinth.serve.spec import ServiceSpec
from plinth.serve.workload import ServiceController

URL = "http://10.0.0.7:41234"


def service() -> Workload:
    return Workload(1, "Service", "svc", "default",
                    ServiceSpec(name="svc", model="mlp", slo_ms=100, service_ms=10,
                                min_replicas=2, max_replicas=4), secret="s" * 32)


def counters(arrivals: int, ok: int, *, rejected: int = 0, url: str = URL) -> RouterReport:
    return RouterReport(url=url, arrivals=arrivals, ok=ok, within_slo=ok, rejected=rejected,
                        latency_s=ok * 0.02, p99_s=0.05, ongoing=1, ready=2, service_ms=10)


def test_replicas_start_once_the_router_reports_and_end_with_it(tmp_path) -> None:
    ctl, w, ctx = ServiceController(tick_s=1.0), service(), LocalContext(tmp_path)
    ctl.start(w, ctx)
    (router,) = ctl.units(w, {}, 0.0)
    assert router.name == "router" and "url" not in w.status
    assert router.spec.command[2] == "plinth.serve.router"
    assert router.spec.env["PLINTH_REPLICA_SECRET"] == w.secret

    assert ctl.report(w, "router", counters(0, 0), ctx) is True  # its address: a change
    assert w.status["url"] == f"{URL}/v1/svc/infer"
    assert ctl.report(w, "router", counters(3, 3), ctx) is False  # counters alone: none
    units = ctl.units(w, {}, 0.0)
    assert [u.name for u in units] == ["router", "replica-0", "replica-1"]
    register = units[1].spec.command[units[1].spec.command.index("--register") + 1]
    assert register == f"{URL}/_plinth/replicas/svc"

    # Its router ends (its node is lost): the replicas that joined it are not wanted, until a
    # new router reports its address; they are started again to join that one.
    ctl.unit_ended(w, "router", ctx)
    assert "url" not in w.status and [u.name for u in ctl.units(w, {}, 0.0)] == ["router"]
    again = "http://10.0.0.8:40000"
    assert ctl.report(w, "router", counters(0, 0, url=again), ctx) is True
    units = ctl.units(w, {"router": Observed("router", 9, State.RUNNING, "n1")}, 0.0)
    assert f"{again}/_plinth/replicas/svc" in units[1].spec.command


def test_windows_are_the_differences_of_the_routers_counters(tmp_path) -> None:
    ctl, w, ctx = ServiceController(tick_s=1.0), service(), LocalContext(tmp_path)
    ctl.start(w, ctx)
    ctl.report(w, "router", counters(10, 10), ctx)
    ctx.t = 1.0
    ctl.tick([w], ctx)
    assert (w.status["rate_rps"], w.status["ready"]) == (10.0, 2)
    ctl.report(w, "router", counters(25, 24, rejected=1), ctx)
    ctx.t = 2.0
    ctl.tick([w], ctx)
    # 15 arrived since the last tick; a rejected one counts as a violation of the SLO.
    assert w.status["rate_rps"] == 15.0 and w.status["p99_ms"] == 10_000.0
    assert ctl._live[w.id].answered == 24


def test_after_a_restart_the_counters_before_it_are_not_counted_again(tmp_path) -> None:
    w = service()
    w.status = {"desired": 2, "router": URL, "url": f"{URL}/v1/svc/infer"}
    ctl, ctx = ServiceController(tick_s=1.0), LocalContext(tmp_path, recovered=True)
    ctl.start(w, ctx)
    assert [u.name for u in ctl.units(w, {}, 0.0)] == ["router", "replica-0", "replica-1"]
    ctl.report(w, "router", counters(5000, 5000), ctx)  # a router that has long served
    ctx.t = 1.0
    ctl.tick([w], ctx)
    assert w.status["rate_rps"] == 0.0  # not 5000 at once
    ctl.report(w, "router", counters(5004, 5004), ctx)
    ctx.t = 2.0
    ctl.tick([w], ctx)
    assert w.status["rate_rps"] == 4.0
