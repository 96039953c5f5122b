"""The autoscaler's minutes of arrival history start with a service's first traffic: minutes
before its clients come tell nothing, and counted from submission they made the first minute
with traffic a part of one (on the real path, Faro planned from a few seconds of traffic)."""

from __future__ import annotations

from plinth.core.kinds import LocalContext, Workload
from plinth.serve.spec import ServiceSpec
from plinth.serve.workload import ServiceController


def test_idle_minutes_before_the_first_request_are_no_history(tmp_path) -> None:
    ctl = ServiceController(policy="faro-fairsum", tick_s=1.0, minute_s=6.0)
    w = Workload(1, "Service", "svc", "default",
                 ServiceSpec(name="svc", model="mlp", slo_ms=100, service_ms=10),
                 secret="s" * 32)
    try:
        ctx = LocalContext(tmp_path)
        ctl.start(w, ctx)
        for now in range(30):  # five idle minutes on the controller's clock
            ctx.t = float(now)
            ctl.tick([w], ctx)
        assert ctl._live[w.id].history == []
        assert ctl._t0 is None
    finally:
        ctl.close()
