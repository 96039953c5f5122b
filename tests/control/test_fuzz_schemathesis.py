"""Fuzz the API from its own /openapi.json with schemathesis (issue 36): every operation, with
an admin token and a tenant's, with inputs that fit the schema and inputs that break it. No
answer may be a 5xx, every status must be one its route documents, every body must match its
schema, and a body that breaks the schema must be refused.

The API is served over real HTTP on loopback (uvicorn, virtual_http.py) by a control plane in
virtual time (virtual.py) that is not root, as `plinth up` run by another user is: no tenant
the fuzzer names becomes a Unix user of this machine. The jobs it accepts run: the clock moves
a second after each request, and a job that is told nothing ends a second after its launch;
nothing runs as a process, so their commands are the fuzzer's own. A step of the control plane
that fails fails the test (a real server's loop would log it and go on). EXAMPLES inputs for
each operation, token and mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.openapi import from_url
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from virtual import VirtualPlatform
from virtual_http import Served, served

pytestmark = pytest.mark.slow

EXAMPLES = 100  # per operation, token and mode


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory) -> Iterator[tuple[Served, dict[str, str], dict[str, int]]]:
    with VirtualPlatform(tmp_path_factory.mktemp("fuzz")) as vp, served(vp) as api:
        with api.client() as c:
            c.set_tenant("fuzz", gpus=1)
            tokens = {"admin": api.token, "tenant": c.add_token("fuzz")}
        jobs = {}  # a job of each, so that the routes of a job find one, with a log to read
        for who, token in tokens.items():
            with api.client(token) as c:
                jobs[who] = c.submit({"name": "seed", "command": ["true"]})
        vp.advance(2)  # ran and ended: its log holds its start
        yield api, tokens, jobs


def body_rejection(ctx, response, case):
    """schemathesis's negative_data_rejection, for a case whose only invalid part is its body.
    A query string carries strings alone, and unknown query parameters are ignored as HTTP
    servers do; and the Authorization header it thinks it removed is the one sent here."""
    meta = case.meta
    if meta is None:
        return None
    body = meta.components.get(ParameterLocation.BODY)
    others = [c for where, c in meta.components.items() if where != ParameterLocation.BODY]
    if body is None or not body.mode.is_negative or any(c.mode.is_negative for c in others):
        return None
    return negative_data_rejection(ctx, response, case)


def fuzz(api: Served, op, mode: GenerationMode, token: str, calls: list[int],
         **fixed: Any) -> None:
    """EXAMPLES cases of one operation in one mode, sent with `token`, with the path
    parameters `fixed` given, a virtual second apart; raises what fails."""
    checks = [not_a_server_error, status_code_conformance, response_schema_conformance]
    if mode is GenerationMode.NEGATIVE:
        checks.append(body_rejection)

    @given(case=op.as_strategy(generation_mode=mode, path_parameters=fixed or None))
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate, Phase.shrink])
    def run(case) -> None:
        calls.append(1)
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=checks)
        api.vp.advance(1)

    try:
        run()
    except Unsatisfiable:  # no invalid input exists (GET /v1/health takes none)
        pass


def test_the_api_answers_every_fuzzed_request_as_documented(fuzzed) -> None:
    api, tokens, jobs = fuzzed
    schema = from_url(f"{api.url}/openapi.json")
    failures: list[str] = []
    calls: list[int] = []
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in GenerationMode:
            for who, token in tokens.items():
                # Random refs find no workload (404); its own job's id is tried as well.
                for fixed in ({}, {"ref": str(jobs[who])}) if "{ref}" in op.path else ({},):
                    try:
                        fuzz(api, op, mode, token, calls, **fixed)
                    except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 -- all reported
                        failures.append(f"{op.label} ({mode.value}, {who}'s token"
                                        f"{', its own job' if fixed else ''}): {e}")
    assert not failures, "\n\n".join(failures)
    assert len(calls) > 1000  # it did fuzz
    with api.client() as c:  # and the server still answers, with what it was asked to run
        assert c.health()["status"] == "ok"
        assert c.jobs_page(all=True, limit=1)[1] > len(jobs)
