"""Named choices: the one registry that every "pick one by name" in Plinth uses.

```python
POLICIES: Registry[type[Policy]] = Registry("policy")
POLICIES.add("fifo", "plinth.sched.policies.fifo:Fifo")  # imported on first `get`

@POLICIES.register("mine")
class Mine(Policy): ...

POLICIES.make("fifo", backfill=False)  # get(name)(**options)
POLICIES.get("fiffo")  # UnknownName: unknown policy 'fiffo'; choose one of: fifo, mine
```

A target is the object itself or a ``"module:attr"`` string, imported on the first `get`, so
that naming a heavy module costs nothing until it is chosen (registries therefore never hold
plain strings as values). Names are matched without case or surrounding spaces.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from plinth.core.errors import SpecError

T = TypeVar("T")


class UnknownName(SpecError, ValueError):
    """A name that is not in a registry. A `ValueError` too, so that a pydantic validator that
    asks a registry reports it with the field's path, as any other bad value."""


class Registry(Generic[T]):
    """Names -> objects (classes, functions, factories), some imported lazily."""

    def __init__(self, what: str, *, field: str = "") -> None:
        self.what = what  # "policy", "trace format": the noun of the error message
        self.field = field  # "--policy": the default prefix of the error message
        self._targets: dict[str, T | str] = {}  # by key: the name without case or spaces
        self._defaults: dict[str, dict[str, Any]] = {}
        self._names: dict[str, str] = {}  # key -> the name as registered ("FLTask")

    @staticmethod
    def _key(name: str) -> str:
        return str(name).strip().lower()

    def add(self, name: str, target: T | str, /, **defaults: Any) -> None:
        """Register `target` (or the ``"module:attr"`` it lives at) as `name`; a name is
        registered once. With `defaults`, `name` is ``partial(target, **defaults)``: one class
        offered in several configurations, each under its own name."""
        key = self._key(name)
        if not key:
            raise ValueError(f"a {self.what} needs a name")
        if key in self._targets:
            raise ValueError(f"{self.what} {key!r} is registered twice")
        if isinstance(target, str) and target.count(":") != 1:
            raise ValueError(f"{self.what} {key!r}: a lazy target is 'module:attr', "
                             f"got {target!r}")
        if defaults and isinstance(target, str):
            self._defaults[key] = defaults  # bound when the target is imported
        elif defaults:
            target = functools.partial(target, **defaults)  # type: ignore[assignment]
        self._targets[key] = target
        self._names[key] = str(name).strip()

    def register(self, name: str) -> Callable[[T], T]:
        """The decorator form of `add`; returns the object unchanged."""
        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj
        return deco

    def check(self, name: str, /, *, field: str | None = None) -> str:
        """`name` as registered; an unknown one is a one-line `UnknownName` listing the
        choices, prefixed by `field` (default: the registry's own)."""
        key = self._key(name)
        if key not in self._targets:
            where = self.field if field is None else field
            raise UnknownName(f"{where + ': ' if where else ''}unknown {self.what} {name!r}; "
                              f"choose one of: {', '.join(self._names.values())}")
        return self._names[key]

    def get(self, name: str, /, *, field: str | None = None) -> T:
        """The object called `name`, importing its module the first time it is asked for."""
        key = self._key(self.check(name, field=field))
        target = self._targets[key]
        if isinstance(target, str):
            module, attr = target.split(":")
            target = getattr(importlib.import_module(module), attr)
            if key in self._defaults:
                target = functools.partial(target, **self._defaults[key])
            self._targets[key] = target
        return target  # type: ignore[return-value]

    def make(self, name: str, /, *, field: str | None = None, **options: Any) -> Any:
        """``get(name)(**options)``: build the named class or call the named factory."""
        return self.get(name, field=field)(**options)  # type: ignore[operator]

    def names(self) -> tuple[str, ...]:
        """The names as registered, in registration order (no imports)."""
        return tuple(self._names.values())

    def items(self) -> Iterator[tuple[str, str]]:
        """(name, ``"module:attr"``) for each entry, without importing anything."""
        for key, target in self._targets.items():
            if not isinstance(target, str):
                obj = target.func if isinstance(target, functools.partial) else target
                target = f"{obj.__module__}:{obj.__qualname__}"
            yield self._names[key], target

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) in self._targets

    def __iter__(self) -> Iterator[str]:
        return iter(self._names.values())

    def __len__(self) -> int:
        return len(self._targets)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._names.values())})"
