"""The one registry: one error format, lazy imports, no name registered twice."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

from plinth.core.errors import SpecError
from plinth.core.registry import Registry, UnknownName


def test_unknown_name_is_one_line_listing_the_choices() -> None:
    r: Registry[type] = Registry("widget", field="--widget")
    r.add("gear", int)
    r.add("cog", float)
    with pytest.raises(SpecError) as e:
        r.get("sprocket")
    assert str(e.value) == "--widget: unknown widget 'sprocket'; choose one of: gear, cog"
    with pytest.raises(UnknownName, match=r"^shop\.part: unknown widget 'x'; choose one of: gear"):
        r.make("x", field="shop.part")
    with pytest.raises(UnknownName, match=r"^unknown widget 'x';"):
        r.check("x", field="")
    assert isinstance(e.value, ValueError)  # so a pydantic validator reports it with its field


def test_names_match_without_case_or_spaces_and_keep_their_spelling() -> None:
    r: Registry[type] = Registry("kind")
    r.add("FLTask", dict)
    assert r.get(" fltask ") is dict and r.check("FLTASK") == "FLTask"
    assert r.names() == ("FLTask",) and list(r) == ["FLTask"] and "fltask" in r and 3 not in r


def test_lazy_target_is_imported_only_on_get(monkeypatch) -> None:
    fake = types.ModuleType("plinth_test_lazy")
    fake.Thing = type("Thing", (), {})
    imported: list[str] = []

    def import_module(name: str) -> types.ModuleType:
        imported.append(name)
        return fake

    monkeypatch.setattr(importlib, "import_module", import_module)
    r: Registry[type] = Registry("thing")
    r.add("thing", "plinth_test_lazy:Thing")
    assert imported == [] and r.names() == ("thing",) and "thing" in r
    assert list(r.items()) == [("thing", "plinth_test_lazy:Thing")]  # listing imports nothing
    assert r.get("thing") is fake.Thing and imported == ["plinth_test_lazy"]
    assert r.get("thing") is fake.Thing and imported == ["plinth_test_lazy"]  # once, then cached


def test_real_registries_import_their_modules_on_first_use() -> None:
    code = ("import sys; from plinth.serve.policies import POLICIES; "
            "assert 'plinth.serve.policies.faro' not in sys.modules; "
            "POLICIES.get('faro-sum'); assert 'plinth.serve.policies.faro' in sys.modules; "
            "from plinth.sched.policies import POLICIES as P; "
            "assert 'plinth.sched.policies.gavel' not in sys.modules; "
            "P.get('gavel'); assert 'plinth.sched.policies.gavel' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_duplicate_registration_is_refused() -> None:
    r: Registry[type] = Registry("policy")
    r.add("fifo", int)
    with pytest.raises(ValueError, match="policy 'fifo' is registered twice"):
        r.add("FIFO", float)
    with pytest.raises(ValueError, match="registered twice"):
        r.register("fifo")(float)
    assert r.get("fifo") is int  # the first one stays


def test_register_decorator_and_make() -> None:
    r: Registry[type] = Registry("shape")

    @r.register("box")
    class Box:
        def __init__(self, side: int = 1) -> None:
            self.side = side

    assert isinstance(Box(), Box)  # the decorator hands the class back
    assert r.make("box", side=3).side == 3


def test_defaults_name_one_class_in_several_configurations() -> None:
    r: Registry[type] = Registry("policy")
    r.add("complex-2", complex, real=2)  # eager target
    r.add("frac-half", "fractions:Fraction", numerator=1, denominator=2)  # lazy target
    assert r.make("complex-2") == 2 and r.make("complex-2", imag=1) == complex(2, 1)
    assert float(r.make("frac-half")) == 0.5
    assert dict(r.items())["frac-half"] == "fractions:Fraction"


def test_a_lazy_target_must_name_module_and_attribute() -> None:
    r: Registry[type] = Registry("policy")
    with pytest.raises(ValueError, match="'module:attr'"):
        r.add("x", "plinth.sched.policies.fifo.Fifo")


def test_registered_names_agree_with_what_they_name() -> None:
    import typing

    from plinth.fl.app import DPSpec, LocalDPSpec
    from plinth.fl.privacy.dp import ACCOUNTANTS
    from plinth.fl.strategies import STRATEGIES

    assert all(STRATEGIES.get(n).name == n for n in STRATEGIES)
    # The app spec lists the accountants for its JSON schema; they must be the registered ones.
    for spec in (DPSpec, LocalDPSpec):
        assert typing.get_args(spec.model_fields["accountant"].annotation) == ACCOUNTANTS.names()
