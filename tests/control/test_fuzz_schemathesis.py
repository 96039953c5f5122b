"""Fuzz a real `plinth up` from its own /openapi.json with schemathesis (issue 36): every
operation, with an admin token and a tenant's, with inputs that fit the schema and inputs that
break it. No answer may be a 5xx, every status must be one its route documents, every body
must match its schema, and a body that breaks the schema must be refused.

The server is a real process on loopback. As root it runs as `nobody`: otherwise every tenant
the fuzzer names would become a Unix user of this machine. The jobs it accepts run, with their
commands replaced by `true` (test_fuzz.py fuzzes commands too, in-process, with a control loop
that never starts them). About 100 s on 2 cores: EXAMPLES inputs for each operation, token
and mode.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from plinth_platform import Platform
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.openapi import from_url
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.slow

EXAMPLES = 100  # per operation, token and mode
NOBODY = 65534


class FuzzedPlatform(Platform):
    """`plinth up` as `nobody` where the tests run as root; as this user otherwise."""

    def start(self) -> Platform:
        as_nobody: list[str] = []
        if os.geteuid() == 0:
            as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
            for d in (self.home.parent, self.home):
                d.mkdir(exist_ok=True)
                os.chown(d, NOBODY, NOBODY)
        with open(self.home.parent / "server.log", "ab") as out:
            self.proc = subprocess.Popen(
                [*as_nobody, sys.executable, "-m", "plinth.cli.main", "up", "--home",
                 str(self.home), "--port", str(self.port), "--fake-gpus", "4xA100", "--grace",
                 "2", "--min-runtime", "0"], stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, "HOME": str(self.home)})
        return self.await_health(self.home.parent / "server.log")


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[tuple[Platform, dict[str, str], dict[str, int]]]:
    # Not under pytest's tmp_path: its folders are closed to `nobody`.
    root = Path(tempfile.mkdtemp(prefix="plinth-schemathesis-"))
    p = FuzzedPlatform(root / "home").start()
    try:
        with p.client() as c:
            c.set_tenant("fuzz", gpus=1)
            tokens = {"admin": p.token, "tenant": c.add_token("fuzz")}
        jobs = {}  # a job of each, so that the routes of a job find one, with a log to read
        for who, token in tokens.items():
            with p.client(token) as c:
                jobs[who] = c.submit({"name": "seed", "command": ["true"]})
        yield p, tokens, jobs
    finally:
        p.stop()
        p.kill_jobs()
        shutil.rmtree(root, ignore_errors=True)


def harmless(case) -> None:
    """A job the fuzzer submits runs `true`, where the server's own user can write nothing of
    its choosing. Only a body whose command fits the schema is changed, and into one that still
    fits it, so that the case stays as valid or invalid as it was generated."""
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("command"), list) and body["command"] \
            and all(isinstance(a, str) for a in body["command"]):
        body["command"] = ["true"]
        for key in ("workdir", "checkpoint_dir"):
            if isinstance(body.get(key), str):
                body.pop(key)


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


def fuzz(op, mode: GenerationMode, token: str, calls: list[int], **fixed: Any) -> None:
    """EXAMPLES cases of one operation in one mode, sent with `token`, with the path
    parameters `fixed` given; raises what fails."""
    checks = [not_a_server_error, status_code_conformance, response_schema_conformance]
    if mode is GenerationMode.NEGATIVE:
        checks.append(body_rejection)

    @given(case=op.as_strategy(generation_mode=mode, path_parameters=fixed or None))
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate, Phase.shrink])
    def run(case) -> None:
        harmless(case)
        calls.append(1)
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=checks)

    try:
        run()
    except Unsatisfiable:  # no invalid input exists (GET /v1/health takes none)
        pass


def test_the_api_answers_every_fuzzed_request_as_documented(fuzzed) -> None:
    platform, tokens, jobs = fuzzed
    schema = from_url(f"{platform.url}/openapi.json")
    failures: list[str] = []
    calls: list[int] = []
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in GenerationMode:
            for who, token in tokens.items():
                # Random refs find no workload (404); its own job's id is tried as well.
                for fixed in ({}, {"ref": str(jobs[who])}) if "{ref}" in op.path else ({},):
                    try:
                        fuzz(op, mode, token, calls, **fixed)
                    except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 -- all reported
                        failures.append(f"{op.label} ({mode.value}, {who}'s token"
                                        f"{', its own job' if fixed else ''}): {e}")
    assert not failures, "\n\n".join(failures)
    assert len(calls) > 1000  # it did fuzz
    assert platform.proc.poll() is None  # and the server is still up
