"""SLO-aware inference autoscaling after Faro (Jeon et al., EuroSys 2025).

Pure decision code: `latency` (queueing model), `utility` (relaxed utilities and objectives),
`predict` (probabilistic forecasts), `solver` (cluster-wide replica allocation), `policies` (Faro and
the baselines) and `controller` (the functional core of the control loop). Around it: `sim` replays
traces in virtual time; `router`, `replica` and `serving` run real replicas on this machine.
This package's own import loads none of them, so that a Service spec is read without scipy; torch
and the web stack come only with `serving` and `replica`.
"""
