from __future__ import annotations

import pytest

from plinth.control.spec import job_spec_from_dict, load_job_spec, parse_duration, parse_job_spec
from plinth.core.errors import SpecError
from plinth.core.resources import Request

BASE = {"name": "t", "command": ["python", "x.py"]}


def test_full_spec_maps_to_request() -> None:
    spec = parse_job_spec("""
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
    spec = parse_job_spec("name: t\ncommand: [python, x.py, --steps, 10, --lr, 0.5, --x, true]\n")
    assert spec.command == ["python", "x.py", "--steps", "10", "--lr", "0.5", "--x", "true"]


def test_whole_gpu_fraction_is_a_whole_gpu() -> None:
    spec = job_spec_from_dict({**BASE, "resources": {"gpu_fraction": 1.0}})
    assert spec.request().gpus == 1 and spec.request().gpu_milli == 0


@pytest.mark.parametrize(("data", "needle"), [
    ({**BASE, "resources": {"gpus": -1}}, "resources.gpus: must be >= 0"),
    ({**BASE, "resources": {"gpu": 1}}, "resources.gpu: unknown field; allowed fields: cpus"),
    ({**BASE, "resouces": {}}, "resouces: unknown field; allowed fields: name"),
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
        job_spec_from_dict(data, source="job.yaml")
    msg = str(e.value)
    assert msg.startswith("job.yaml: ") and needle in msg and "\n" not in msg


def test_invalid_yaml_names_the_line(tmp_path) -> None:
    p = tmp_path / "job.yaml"
    p.write_text("name: x\ncommand: [python\nresources: {}\n")
    with pytest.raises(SpecError, match=r"job.yaml:\d+: invalid YAML"):
        load_job_spec(str(p))
    with pytest.raises(SpecError, match="cannot read job spec"):
        load_job_spec(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200),
                                               ("1.5d", 129600), (45, 45), ("10", 10)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bundled_examples_are_valid() -> None:
    from pathlib import Path

    for p in sorted(Path("examples/jobs").glob("*.yaml")):
        spec = load_job_spec(str(p))
        assert spec.command and spec.request().num_gpus > 0
