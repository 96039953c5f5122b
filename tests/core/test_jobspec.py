from __future__ import annotations

import pytest

from plinth.control.kinds import job_to_run
from plinth.core.jobspec import JobSpec, parse_duration
from plinth.core.errors import SpecError
from plinth.core.resources import Request
from plinth.core.spec import load_spec, spec_from_dict

BASE = {"name": "t", "command": ["python", "x.py"]}


def test_full_spec_maps_to_request() -> None:
    spec = load_spec("""
name: train
tenant: research
command: python train.py --steps 10
env: {SEED: 1, DEBUG: true}
resources: {cpus: 2, memory: 8Gi, gpu_fraction: 0.25, gpu_memory: 4Gi, gpu_model: a100}
workers: 2
priority: 5
preemptible: false
max_runtime: 30m
retries: 2
""")
    assert spec.command == ["/bin/sh", "-c", "python train.py --steps 10"]
    assert spec.env == {"SEED": "1", "DEBUG": "true"}
    assert spec.max_runtime == 1800
    assert spec.request() == Request(gpu_milli=250, gpu_memory_mib=4096, cpus_milli=2000,
                                     memory_mib=8192, workers=2, gpu_models=("A100",))


def test_yaml_scalars_in_a_command_are_arguments() -> None:
    spec = load_spec("name: t\ncommand: [python, x.py, --steps, 10, --lr, 0.5, --x, true]\n")
    assert spec.command == ["python", "x.py", "--steps", "10", "--lr", "0.5", "--x", "true"]


def test_whole_gpu_fraction_is_a_whole_gpu() -> None:
    spec = spec_from_dict({**BASE, "resources": {"gpu_fraction": 1.0}}, kind="Job")
    assert spec.request().gpus == 1 and spec.request().gpu_milli == 0


@pytest.mark.parametrize(("data", "needle"), [
    ({**BASE, "resources": {"gpus": -1}}, "resources.gpus: must be >= 0"),
    ({**BASE, "resources": {"gpu": 1}}, "resources.gpu: unknown field; allowed fields: cpus"),
    ({**BASE, "resouces": {}}, "resouces: unknown field; allowed fields: kind, name"),
    ({**BASE, "resources": {"gpus": 1, "gpu_fraction": 0.5}}, "not both"),
    ({**BASE, "resources": {"gpu_memory": "4Gi"}}, "gpu_memory limits a gpu_fraction"),
    ({**BASE, "resources": {"gpu_fraction": 1.5}}, "resources.gpu_fraction: must be <= 1"),
    ({**BASE, "resources": {"memory": "lots"}}, "resources.memory: expected MiB"),
    ({**BASE, "resources": {"gpu_model": "Z9000"}}, "resources.gpu_model"),
    ({**BASE, "workers": 0}, "workers: must be >= 1"),
    ({**BASE, "max_runtime": "soon"}, "max_runtime: expected seconds"),
    ({**BASE, "name": "bad name!"}, "name: must be"),
    ({"name": "t"}, "command: required field is missing"),
    ({**BASE, "command": []}, "command: must not be empty"),
    ([1, 2], "expected a mapping"),
])
def test_bad_specs_name_the_field(data: object, needle: str) -> None:
    with pytest.raises(SpecError) as e:
        spec_from_dict(data, source="job.yaml", kind="Job")
    msg = str(e.value)
    assert msg.startswith("job.yaml: ") and needle in msg and "\n" not in msg


def test_invalid_yaml_names_the_line(tmp_path) -> None:
    p = tmp_path / "job.yaml"
    p.write_text("name: x\ncommand: [python\nresources: {}\n")
    with pytest.raises(SpecError, match=r"job.yaml:\d+: invalid YAML"):
        load_spec(p)
    with pytest.raises(SpecError, match="cannot read a spec"):
        load_spec(tmp_path / "missing.yaml")


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200),
                                               ("1.5d", 129600), (45, 45), ("10", 10)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bundled_examples_are_valid() -> None:
    from pathlib import Path

    for p in sorted(Path("examples/jobs").glob("*.yaml")):
        spec = load_spec(p)
        assert isinstance(spec, JobSpec) and spec.kind == "Job"
        assert spec.command and spec.request().num_gpus > 0


def test_the_control_plane_refuses_kinds_it_does_not_run_yet(tmp_path) -> None:
    p = tmp_path / "svc.yaml"
    p.write_text("kind: Service\nname: a\nmodel: tiny-cnn\nslo_ms: 10\n")
    with pytest.raises(SpecError) as e:
        job_to_run(load_spec(p), str(p))
    assert str(e.value) == (f"{p}: kind: a Service spec is not a Job; submit it with "
                            "`plinth submit FILE` (Client.submit_workload)")
    cluster = spec_from_dict({"kind": "Cluster", "nodes": [{"name": "a", "gpus": 1,
                                                             "gpu_model": "T4"}]}, source="c")
    with pytest.raises(SpecError, match=r"^c.yaml: kind: .* Cluster specs yet; use `plinth sim"):
        job_to_run(cluster, "c.yaml")
    job = spec_from_dict(BASE)
    assert job_to_run(job) is job


def test_cli_submit_names_the_kind_before_sending_anything(tmp_path) -> None:
    from typer.testing import CliRunner

    from plinth.cli.main import app

    good = tmp_path / "job.yaml"
    good.write_text("name: t\ncommand: [true]\n")
    svc = tmp_path / "svc.yaml"
    svc.write_text("kind: Cluster\nnodes: [{name: a, gpus: 1, gpu_model: T4}]\n")
    # No server listens here: the spec is refused before the client tries to reach one.
    res = CliRunner().invoke(app, ["submit", str(good), str(svc), "--server", "127.0.0.1:9"])
    assert res.exit_code != 0
    assert "kind: the control plane does not run Cluster specs yet" in str(res.exception) + \
        res.output
    assert "cannot reach" not in str(res.exception) + res.output


def test_api_answers_a_bad_kind_with_one_line(tmp_path) -> None:
    from fastapi.testclient import TestClient

    from plinth.control.api import create_app
    from plinth.control.auth import Auth
    from plinth.control.service import ControlPlane
    from plinth.control.store import Store
    from plinth.runtime.local import LocalRuntime

    store = Store(str(tmp_path / "plinth.db"))
    auth = Auth(store)
    token = auth.bootstrap(tmp_path)
    cp = ControlPlane(store, LocalRuntime(tmp_path / "runtime", fake_gpus="1xA100"), home=tmp_path)
    with TestClient(create_app(cp, auth)) as http:
        r = http.post("/v1/workloads", json={**BASE, "kind": "Nope"},
                      headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 422
    assert r.json()["detail"] == ("kind: unknown kind 'Nope'; choose one of: Job, Service, "
                                  "FLTask, Tune, Cluster")
