"""The one spec loader: every kind through one path, every error one line with file, line,
field and value. The inputs here are wrong on purpose."""

from __future__ import annotations

from pathlib import Path

import pytest

import plinth.control.kinds  # noqa: F401  # registers the kinds that load_spec reads
from plinth.core.jobspec import JobSpec
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
     "spec.yaml:3: workers: input should be a valid integer (got 'many')"),
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


# --- inputs that would cost far more than their size, and numbers that are not numbers ---------

def _bomb(levels: int) -> str:
    """A "billion laughs" spec: each level an anchored list of nine aliases to the one before
    (9**levels values from a few hundred bytes), under a field a Job has."""
    rows = ["x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    rows += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "env:\n" + "".join(f"  {r}\n" for r in rows) + "command: [true]\n"


def test_an_alias_bomb_is_refused_at_the_alias_that_passes_the_bound(tmp_path) -> None:
    # 9**6 = 531,441 values: enough to cross the bound (100,000), few enough that the code
    # before it answered at once (with another error) instead of stalling this test.
    text = _bomb(6)
    assert len(text) < 600
    assert error(text, tmp_path) == ("spec.yaml:7: invalid YAML: aliases repeat more than "
                                     "100000 values")
    # Anchors and merge keys within the bound still read as they always did.
    p = tmp_path / "ok.yaml"
    p.write_text("command: [true]\nafter: &deps [1, 2]\nafterok: *deps\n"
                 "resources: {<<: &small {cpus: 2}, memory: 64}\n")
    spec = load_spec(p)
    assert spec.afterok == [1, 2] and spec.resources.cpus == 2


def test_a_recursive_alias_or_deep_nesting_is_one_line(tmp_path) -> None:
    assert error("command: [true]\nenv: &a {A: [*a]}\n", tmp_path) == (
        "spec.yaml:2: invalid YAML: an alias inside the value it names (recursive)")
    deep = "command: [true]\nenv: {A: " + "[" * 5000 + "]" * 5000 + "}\n"  # was a RecursionError
    assert error(deep, tmp_path) == "spec.yaml:2: invalid YAML: values nest deeper than 64 levels"


SERVICE_CPUS_0 = SERVICE + "resources: {cpus: 0}\n"


@pytest.mark.parametrize("text, expected", [
    ("command: [true]\nresources: {cpus: 0}\n", "spec.yaml:2: resources.cpus: must be > 0 (got 0)"),
    ("command: [true]\nresources:\n  memory: 0Gi\n",
     "spec.yaml:3: resources.memory: must be > 0 (got 0)"),
    (SERVICE_CPUS_0, "spec.yaml:5: resources.cpus: must be > 0 (got 0)"),
    ("kind: FLTask\nresources: {cpus: 1, memory: 0}\n",
     "spec.yaml:2: resources.memory: must be > 0 (got 0)"),
    # A Tune task asks for no CPUs of its own (its shares are cores); its memory had a floor
    # (64 MiB) but no ceiling.
    ("kind: Tune\nmodel: m:f\ninput_shape: [1]\nshares: [1]\ntrials: 1\nmemory: 2199023255552\n",
     "spec.yaml:6: memory: must be <= 1099511627776 MiB (got 2199023255552 MiB)"),
])
def test_every_kind_asks_for_some_cpu_and_memory(tmp_path, text, expected) -> None:
    assert error(text, tmp_path) == expected


def test_the_floor_is_the_tenants_alone() -> None:
    """The defaults meet it; a spec the store holds (accepted before the floor) or one the
    platform makes for its own units (a Tune tracker: no CPU) is read with TRUSTED."""
    from plinth.core.spec import TRUSTED
    from plinth.tune.controller import tracker_job
    from plinth.tune.spec import TuneSpec

    assert spec_from_dict({"command": ["true"]}).resources.model_dump(
        include={"cpus", "memory"}) == {"cpus": 1.0, "memory": 4096}
    stored = {"command": ["true"], "resources": {"cpus": 0, "memory": 0}}
    with pytest.raises(SpecError, match="resources.cpus: must be > 0"):
        spec_from_dict(stored)
    assert JobSpec.model_validate(stored, context=TRUSTED).resources.cpus == 0
    assert spec_from_dict(stored, stored=True).resources.memory == 0
    tune = TuneSpec.model_construct(name="t", tenant=None, priority=0, db="/tmp/db",
                                    memory=256, model="m:f")
    assert tracker_job(tune).resources.cpus == 0


@pytest.mark.parametrize("text, expected", [
    ("command: [true]\nworkers: true\n",
     "spec.yaml:2: workers: input should be a valid integer (got True)"),
    ("command: [true]\nresources: {gpus: '2'}\n",
     "spec.yaml:2: resources.gpus: input should be a valid integer (got '2')"),
    ("command: [true]\npriority: 1.5\n",
     "spec.yaml:2: priority: input should be a valid integer (got 1.5)"),
    ("command: [true]\narray: '4294967296'\n",
     "spec.yaml:2: array: an index is at most 2147483647, got 4294967296 in '4294967296'"),
    (SERVICE + "service_ms: 1.0e+300\n",
     "spec.yaml:5: service_ms: must be <= 3600000 (got 1e+300)"),
    ("kind: FLTask\nserver: {straggler_timeout: .inf}\n",
     "spec.yaml:2: server.straggler_timeout: must be a finite number (got inf)"),
    # These two were a TypeError and an OverflowError: a 500 where the API read them.
    ("command: [true]\nresources: {gpu_model: 5}\n",
     "spec.yaml:2: resources.gpu_model: expected a GPU model or a list of them, got 5"),
    ("command: [true]\nresources: {memory: 1" + "0" * 400 + "Gi}\n",
     "spec.yaml:2: resources.memory: must be a finite number (got '1" + "0" * 400 + "Gi')"),
])
def test_numbers_are_numbers_bounded_and_finite(tmp_path, text, expected) -> None:
    assert error(text, tmp_path) == expected
