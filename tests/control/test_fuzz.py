"""Fuzz the REST API with schemathesis, from the app's own OpenAPI schema: no 500s, and every
response matches the schema. The control loop is not started, so the random specs that get
accepted queue but never run as processes."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.openapi import from_asgi
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from plinth.control.api import create_app
from plinth.control.auth import Auth
from plinth.control.service import ControlPlane
from plinth.control.store import Store
from plinth.runtime.local import LocalRuntime


def _app():
    home = Path(tempfile.mkdtemp(prefix="plinth-fuzz-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    store = Store(str(home / "plinth.db"))
    auth = Auth(store)
    token = auth.bootstrap(home)
    cp = ControlPlane(store, LocalRuntime(home / "runtime", fake_gpus="4xA100"), home=home)
    return create_app(cp, auth), token


APP, TOKEN = _app()
SCHEMA = from_asgi("/openapi.json", APP)
OPERATIONS = [op.ok() for op in SCHEMA.get_all_operations()]


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.label)
def test_api_has_no_server_errors(op) -> None:
    @given(case=op.as_strategy())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    def run(case) -> None:
        case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"},
                               checks=[not_a_server_error, response_schema_conformance,
                                       status_code_conformance])

    run()
