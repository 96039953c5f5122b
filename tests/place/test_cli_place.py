"""`plinth place` through Typer's CliRunner: the plan, the JSON figures and one-line errors."""

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from plinth.cli.place import place
from plinth.core.errors import PlinthError
from plinth.place import Plan, apply, models

KEYS = {"algo", "devices", "nodes_before", "nodes_after", "placement_time_s",
        "predicted_step_time_s", "single_device_step_time_s", "peak_memory_bytes"}


def tiny(batch: int):
    return models.transformer(batch, layers=2, d_model=32, heads=2, seq=8, vocab=64)


TARGET = f"{__name__}:tiny"


@pytest.fixture(scope="module")
def app():
    a = typer.Typer()
    a.command()(place)
    return a


def run(app, *args):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("algo", ["m-etf", "m-sct", "m-topo"])
def test_place_writes_plan_and_figures(app, tmp_path, algo):
    out, js = tmp_path / "plan.json", tmp_path / "r.json"
    r = run(app, TARGET, "--devices", "3", "--memory", "200KiB", "--algo", algo, "--batch", "4",
            "--profile-batch", "2", "--json", str(js), "--out", str(out))
    assert r.exit_code == 0, r.output + repr(r.exception)
    fig = json.loads(js.read_text())
    assert KEYS <= fig.keys() and fig["algo"] == algo
    assert len(fig["peak_memory_bytes"]) == 3 and len(fig["devices"]) == 3
    assert all(p <= 200 * 2**10 for p in fig["peak_memory_bytes"])
    assert 0 < fig["nodes_after"] <= fig["nodes_before"]
    assert fig["predicted_step_time_s"] > 0 and fig["single_device_step_time_s"] > 0
    assert "predicted" in r.output and "placement took" in r.output
    plan = Plan.load(out)
    assert len(set(plan.assign.values())) > 1  # 200 KiB cannot hold it all
    plan.devices = ["cpu"] * 3
    model, inputs = tiny(4)
    model.eval()
    placed = apply(model, plan).eval()
    with torch.no_grad():
        torch.testing.assert_close(placed(*inputs), model(*inputs))


def test_place_writes_its_plan_under_results_by_default(app, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the repository root, for a user following the README
    r = run(app, TARGET, "--devices", "2", "--memory", "1MiB", "--batch", "4",
            "--profile-batch", "2")
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert not (tmp_path / "plan.json").exists()
    assert Plan.load(tmp_path / "results" / "plan.json").devices


@pytest.mark.parametrize("args, needle", [
    (["nomodulefactory"], "MODULE:FACTORY"),
    (["no.such.module:f"], "cannot import module 'no.such.module'"),
    (["plinth.place.models:nothing"], "no factory 'nothing'"),
    ([TARGET, "--memory", "lots"], "--memory: expected a size like 16GiB"),
    ([TARGET, "--memory", "0GiB"], "--memory: must be more than 0"),
    ([TARGET, "--devices", "0"], "--devices: must be at least 1"),
    ([TARGET, "--algo", "greedy"], "--algo: unknown algorithm 'greedy'"),
    ([TARGET, "--batch", "4", "--profile-batch", "9"], "--profile-batch"),
    ([TARGET, "--memory", "64KiB", "--batch", "2", "--comm", "pcie"], "needs"),
    ([TARGET, "--comm", "wifi"], "--comm"),
])
def test_bad_input_is_one_line_naming_the_field(app, tmp_path, args, needle):
    r = run(app, *args, "--out", str(tmp_path / "p.json"))
    assert isinstance(r.exception, PlinthError), r.output + repr(r.exception)
    msg = str(r.exception)
    assert "\n" not in msg and needle in msg, msg


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x):
        h = self.a(x)
        return self.b(h) if h.sum() > 0 else h   # fx cannot trace this


def branchy(batch: int):
    torch.manual_seed(0)
    return Branchy(), (torch.randn(batch, 32),)


def test_untraceable_model_is_placed_from_module_hooks_and_the_user_is_told(app, tmp_path):
    r = run(app, f"{__name__}:branchy", "--devices", "2", "--memory", "1MiB", "--batch", "4",
            "--comm", "pcie", "--out", str(tmp_path / "p.json"))
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "note:" in r.output and "module-level hooks" in r.output
    assert Plan.load(tmp_path / "p.json").tracer == "hooks"


@pytest.mark.parametrize("text, expected", [
    ("16GiB", 16 << 30), ("16Gi", 16 << 30), ("512MiB", 512 << 20), ("16GB", 16 * 10**9),
    ("1.5 GiB", 3 << 29), ("2048", 2048), ("64kib", 64 << 10),
])
def test_memory_sizes(text, expected):
    from plinth.place import parse_size

    assert parse_size(text) == expected
