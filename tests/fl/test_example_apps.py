"""Every app YAML shipped under examples/fl loads and passes the spec's checks."""

from pathlib import Path

import pytest

from plinth.fl.app import load_app

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "fl").rglob("*.yaml"))


def test_the_examples_are_found():
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_example_app_loads(path):
    spec = load_app(str(path), {})
    assert spec.name and Path(spec.resolve(spec.code)).is_file()
