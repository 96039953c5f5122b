"""The one spec loader: every kind through one path, every error one line with file, line,
field and value. The inputs here are wrong on purpose."""

from __future__ import annotations

from pathlib import Path

import pytest

from plinth.control.spec import JobSpec
from plinth.core.errors import SpecError
from plinth.core.spec import KINDS, ClusterSpec, load_spec, spec_from_dict
from plinth.fl.app import AppSpec
from plinth.serve.spec import ServiceSpec

EXAMPLES = Path(__file__).parents[2] / "examples"
SERVICE = "kind: Service\nname: a\nmodel: tiny-cnn\nslo_ms: 10\n"


def error(text: str, tmp_path: Path, **kw) -> str:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(p, **kw)
    msg = str(e.value)
    assert "\n" not in msg, "errors are one line"
    return msg.replace(str(p), "spec.yaml")


def test_each_kind_loads_into_its_model(tmp_path) -> None:
    p = tmp_path / "s.yaml"
    for text, model, kind in (
            ("name: t\ncommand: [true]\n", JobSpec, "Job"),  # no kind: a Job
            ("kind: Job\nname: t\ncommand: [true]\n", JobSpec, "Job"),
            (SERVICE, ServiceSpec, "Service"),
            ("kind: FLTask\nname: app\n", AppSpec, "FLTask"),
            ("kind: cluster\nnodes: [{name: a, gpus: 1, gpu_model: T4}]\n", ClusterSpec,
             "Cluster")):  # kinds match without case, and come back spelt as registered
        p.write_text(text)
        spec = load_spec(p)
        assert type(spec) is model and spec.kind == kind


def test_unknown_kind_lists_the_known_ones(tmp_path) -> None:
    assert error("name: t\nkind: Pipeline\n", tmp_path) == (
        "spec.yaml:2: kind: unknown kind 'Pipeline'; choose one of: Job, Service, FLTask, Tune, "
        "Cluster")
    with pytest.raises(SpecError, match=r"^api: kind: unknown kind 'Notebook'; choose one of: Job,"):
        spec_from_dict({"kind": "Notebook"}, source="api")


@pytest.mark.parametrize("text, expected", [
    ("name: t\ncommand: [true]\nresources:\n  gpus: -1\n",
     "spec.yaml:4: resources.gpus: must be >= 0 (got -1)"),
    ("name: t\ncommand: [true]\nworkers: many\n",
     "spec.yaml:3: workers: input should be a valid integer, unable to parse string as an "
     "integer (got 'many')"),
    (SERVICE + "max_replicas: 0\n", "spec.yaml:5: max_replicas: must be >= 1 (got 0)"),
    (SERVICE.replace("slo_ms: 10", "slo_ms: -3"), "spec.yaml:4: slo_ms: must be > 0 (got -3)"),
    ("kind: FLTask\nserver:\n  fraction: 1.5\n",
     "spec.yaml:3: server.fraction: must be <= 1 (got 1.5)"),
    ("kind: FLTask\nstrategy: {name: fedmagic}\n",
     "spec.yaml:2: strategy.name: unknown strategy 'fedmagic'; choose one of: fedavg,"),
    ("kind: Cluster\nnodes:\n  - {name: a, gpus: 8, gpu_model: V100}\n"
     "  - {name: b, gpus: -2, gpu_model: V100}\n",
     "spec.yaml:4: nodes[1].gpus: must be >= 0 (got -2)"),
])
def test_a_bad_field_names_file_line_field_and_value(tmp_path, text, expected) -> None:
    assert error(text, tmp_path).startswith(expected)


def test_a_misspelt_field_is_the_error_shown(tmp_path) -> None:
    assert error("name: t\ncommand: [true]\nresouces: {}\n", tmp_path).startswith(
        "spec.yaml:3: resouces: unknown field; allowed fields: kind, name,")


def test_yaml_syntax_error_names_the_line(tmp_path) -> None:
    assert error("name: t\ncommand: [true\nresources: {}\n", tmp_path).startswith(
        "spec.yaml:3: invalid YAML: ")
    assert error("kind: Job\n---\nkind: Job\n", tmp_path).startswith(
        "spec.yaml:2: invalid YAML: expected a single document")


@pytest.mark.parametrize("text, got", [("- a\n- b\n", "a list"), ("just words\n", "a str"),
                                       ("", "an empty document"), ("# only a comment\n",
                                                                   "an empty document")])
def test_a_document_that_is_not_a_mapping(tmp_path, text, got) -> None:
    assert error(text, tmp_path) == f"spec.yaml: expected a mapping of spec fields, got {got}"


def test_a_command_of_one_kind_refuses_another_and_defaults_to_its_own(tmp_path) -> None:
    assert error("kind: Job\nname: t\ncommand: [true]\n", tmp_path, kind="Service") == (
        "spec.yaml:1: kind: this command reads a Service spec, not a Job spec (run that with "
        "`plinth submit FILE`)")
    p = tmp_path / "svc.yaml"
    p.write_text(SERVICE.replace("kind: Service\n", ""))  # a command of one kind needs no kind
    assert isinstance(load_spec(p, kind="Service"), ServiceSpec)
    assert error(SERVICE.replace("kind: Service\n", ""), tmp_path).startswith(
        "spec.yaml:2: model: unknown field")  # ... but without one it is read as a Job


def test_text_and_dicts_go_through_the_same_checks() -> None:
    with pytest.raises(SpecError, match=r"^inline:2: workers: must be >= 1 \(got 0\)$"):
        load_spec("command: [true]\nworkers: 0\n", source="inline")
    with pytest.raises(SpecError, match=r"^body: workers: must be >= 1 \(got 0\)$"):
        spec_from_dict({"command": ["true"], "workers": 0}, source="body")
    with pytest.raises(SpecError, match=r"^workers: must be >= 1 \(got 0\)$"):  # the API's form
        spec_from_dict({"command": ["true"], "workers": 0}, source="")


def test_overrides_replace_fields_without_touching_the_document() -> None:
    doc = {"kind": "FLTask", "server": {"rounds": 3, "fraction": 0.5}}
    spec = spec_from_dict(doc, overrides={"server.rounds": 7, "seed": None, "train.lr": 0.1})
    assert (spec.server.rounds, spec.server.fraction, spec.seed, spec.train.lr) == (7, 0.5, 0, 0.1)
    assert doc == {"kind": "FLTask", "server": {"rounds": 3, "fraction": 0.5}}
    with pytest.raises(SpecError, match=r"^a.yaml: server: expected a mapping to set "
                                        r"server.rounds in, got 5$"):
        spec_from_dict({"kind": "FLTask", "server": 5}, source="a.yaml",
                       overrides={"server.rounds": 7})


def test_missing_file_names_it(tmp_path) -> None:
    with pytest.raises(SpecError, match=r"nope.yaml: cannot read a Service spec: "):
        load_spec(tmp_path / "nope.yaml", kind="Service")


def test_every_example_names_its_kind_and_loads() -> None:
    files = sorted(EXAMPLES.rglob("*.yaml"))
    assert len(files) >= 10
    for f in files:
        assert f.read_text().count("\nkind: ") == 1, f
        spec = load_spec(f)
        assert type(spec) is KINDS.get(spec.kind), f
