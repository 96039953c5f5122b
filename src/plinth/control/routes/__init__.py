"""The REST API's routes, one `APIRouter` per resource, assembled by `plinth.control.api`.

- `workloads`: submit, list, show and cancel a workload of any kind. A Job is the simplest kind
  (`jobs` holds what is particular to it); a Service, an FLTask or a Tune has several units.
- `logs`: a job's log.
- `nodes`, `tenants` (with their API tokens), `health`.

What every route shares (the control plane, the caller's token, the error format) is in
`deps` and `errors`; the cap on request bodies is `plinth.control.bodylimit`.
"""
