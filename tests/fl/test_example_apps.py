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


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "admm" not in p.name],
                         ids=lambda p: p.name)
def test_example_app_passes_the_real_server_and_client_checks(path):
    """Every server example runs as it is on `plinth fl server|client` too: no seeded noise
    (the DP example's `noise:` is auto, a CSPRNG there); tokens and TLS come from flags."""
    from plinth.fl.deploy import refuse_seeded_noise

    spec = load_app(str(path), {})
    for role in ("plinth fl server", "plinth fl client"):
        refuse_seeded_noise(spec, str(path), role)
    assert spec.privacy.dp is None or spec.privacy.dp.noise == "auto"
