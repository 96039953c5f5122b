from pathlib import Path

import pytest

from plinth.core.errors import SpecError
from plinth.fl.app import load_app

APPS = Path(__file__).parent / "apps"
EXAMPLE = Path(__file__).parents[2] / "examples" / "fl" / "mnist" / "app.yaml"


def test_example_and_test_apps_load():
    spec = load_app(EXAMPLE)
    assert spec.strategy.name == "fedavg" and spec.data.partition == "dirichlet"
    assert load_app(APPS / "tiny.yaml", {"server.rounds": 7}).server.rounds == 7


@pytest.mark.parametrize("text, words", [
    ("server: {rounds: 0}", "server.rounds"),
    ("server: {fraction: 1.5}", "server.fraction"),
    ("servr: {}", "servr: unknown field"),
    ("strategy: {name: fedmagic}", "strategy.name: unknown strategy 'fedmagic'"),
    ("strategy: {name: fedprox, options: {mu: 1}}", "strategy.options.mu"),
    ("compression: {kind: zip}", ":1: compression.kind: unknown compression 'zip'; choose one of"),
    ("data: {partition: random}", "data.partition"),
    ("- a\n- b", "expected a mapping"),
    ("server: [", "invalid YAML"),
])
def test_bad_app_yaml_is_one_line_naming_file_and_field(tmp_path, text, words):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_app(p)
    msg = str(e.value)
    assert msg.startswith(str(p)) and words in msg and "\n" not in msg


def test_missing_file():
    with pytest.raises(SpecError, match="cannot read"):
        load_app("/nonexistent/app.yaml")
