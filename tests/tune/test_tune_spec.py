"""Tune specs: each bad input is one line naming the field; a good spec registers as kind Tune."""

from __future__ import annotations

import textwrap

import pytest

import plinth.control.kinds  # noqa: F401  # registers the kinds that load_spec reads
from plinth.core.errors import SpecError
from plinth.core.spec import load_spec

GOOD = """\
kind: Tune
name: t
model: plinth.tune.models:tiny_linear
input_shape: [1, 64]
target: cpu
shares: [1, 2]
trials: 4
"""


def _load(text: str):
    return load_spec(textwrap.dedent(text), source="tune.yaml")


def _error(text: str) -> str:
    with pytest.raises(SpecError) as e:
        _load(text)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.slow  # imports the model through TVM (seconds on a quiet machine)
def test_good_spec_loads_as_tune():
    spec = _load(GOOD)
    assert type(spec).__name__ == "TuneSpec" and spec.shares == [1, 2]


def test_share_outside_0_100_names_the_share():
    assert _error(GOOD.replace("[1, 2]", "[1, 150]")) == \
        "tune.yaml:6: shares[1]: must be <= 100 (got 150)"
    assert _error(GOOD.replace("[1, 2]", "[0, 2]")) == \
        "tune.yaml:6: shares[0]: must be > 0 (got 0)"


def test_zero_trials_names_trials():
    assert _error(GOOD.replace("trials: 4", "trials: 0")) == \
        "tune.yaml:7: trials: must be >= 1 (got 0)"


def test_cuda_without_gpu_names_target(monkeypatch):
    monkeypatch.setattr("plinth.tune.spec.gpu_count", lambda: 0)
    msg = _error(GOOD.replace("target: cpu", "target: cuda").replace("[1, 2]", "[25, 50]"))
    assert msg.startswith("tune.yaml:5: target: cuda: this machine has no NVIDIA GPU")


def test_fractional_cores_on_cpu_are_refused():
    assert "whole number of cores, got 1.5" in _error(GOOD.replace("[1, 2]", "[1.5, 2]"))


@pytest.mark.slow  # torch.export and TVM's import of the model
def test_model_tvm_cannot_import_names_the_operator(tmp_path, monkeypatch):
    (tmp_path / "lgamma_model.py").write_text(textwrap.dedent("""\
        import torch

        class LGamma(torch.nn.Module):
            def forward(self, x):
                return torch.lgamma(x)

        def make():
            return LGamma()
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    msg = _error(GOOD.replace("plinth.tune.models:tiny_linear", "lgamma_model:make"))
    assert msg.startswith("tune.yaml:3: model: lgamma_model:make: TVM's Relax frontend has "
                          "no converter for operator lgamma")
