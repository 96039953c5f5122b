"""SLO-aware inference autoscaling after Faro (Jeon et al., EuroSys 2025).

Pure decision code: `latency` (queueing model), `utility` (relaxed utilities and objectives),
`predict` (probabilistic forecasts), `solver` (cluster-wide replica allocation), `policies` (Faro and
the baselines) and `controller` (the functional core of the control loop). Around it: `sim`
replays traces in virtual time; `router` and `replica` are the processes of a service's units,
and `workload` is the Service kind's controller. This package's own import loads none of them,
so that a Service spec is read without scipy; torch and the web stack come only with `router`
and `replica`.
"""
