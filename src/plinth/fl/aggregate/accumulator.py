"""The one accumulator interface: what the server and the strategies ask of a round's sum.

Three accumulators implement it: the streaming engine (`engine.StreamingAggregator`, eager,
O(model) memory), the LIFL tree's (`tree.TreeAccumulator`, folded by leaf processes, some
rejections known only when the round settles) and the safeguards' collecting one
(`safeguards.collecting.CollectingAggregator`, every update kept for a robust rule or DP).

Every update goes through the same boundary check (`vet`: weight, array count, shapes, dtypes)
against the same model description (`template_of`), so the three cannot drift apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl.messages import NDArrays

# the model as the accumulators see it: (shape, dtype) per array
Template = list[tuple[tuple[int, ...], np.dtype]]
Update = tuple[NDArrays, float]  # (arrays, weight)


class UpdateRejected(PlinthError):
    """An update that must not be aggregated. The message says why; the round goes on."""


def template_of(model: Sequence[Any]) -> Template:
    """The (shape, dtype) of each array of `model`: arrays, or (shape, dtype) pairs."""
    return [(tuple(t.shape), np.dtype(t.dtype)) if hasattr(t, "shape") else
            (tuple(t[0]), np.dtype(t[1])) for t in model]


def check_shapes(template: Template, arrays: NDArrays) -> None:
    """Raise `UpdateRejected` unless `arrays` match the template's count, shapes and dtypes."""
    if len(arrays) != len(template):
        raise UpdateRejected(f"update has {len(arrays)} arrays, the model has {len(template)}")
    for i, (a, (shape, dtype)) in enumerate(zip(arrays, template)):
        if tuple(a.shape) != tuple(shape):
            raise UpdateRejected(f"array {i}: shape {tuple(a.shape)}, expected {tuple(shape)}")
        if a.dtype != dtype and \
                np.dtype(a.dtype).newbyteorder("=") != np.dtype(dtype).newbyteorder("="):
            raise UpdateRejected(f"array {i}: dtype {a.dtype}, expected {np.dtype(dtype)}")


def check_update(template: Template, arrays: NDArrays, weight: float) -> None:
    """The boundary check every accumulator runs first: a finite weight > 0, the model's
    shapes and dtypes. Raises `UpdateRejected`."""
    try:
        ok = math.isfinite(weight) and weight > 0
    except TypeError:
        ok = False
    if not ok:
        raise UpdateRejected(f"weight {weight!r} must be a finite number > 0")
    check_shapes(template, arrays)


def vet(template: Template, updates: Sequence[Update]
        ) -> tuple[list[int], list[tuple[int, str]]]:
    """Split `updates` into the indices that pass `check_update` and ``(index, reason)`` for
    the others."""
    good, rejected = [], []
    for j, (arrays, w) in enumerate(updates):
        try:
            check_update(template, arrays, w)
        except UpdateRejected as e:
            rejected.append((j, str(e)))
            continue
        good.append(j)
    return good, rejected


@runtime_checkable
class Accumulator(Protocol):
    """A round's sum of updates.

    `add_many` folds (or keeps) a batch and returns the ``(index, reason)`` refused at once;
    an accumulator that finds problems later (the tree: NaN in a leaf, a leaf that died) names
    the next updates with `name_updates` and reports them from `settle`. `count`,
    `total_weight` and `metrics` describe what was folded; `mean` ends the round's folding.
    """

    count: int
    total_weight: float
    metrics: dict[str, float]

    def add_many(self, updates: Sequence[Update]) -> list[tuple[int, str]]: ...

    def mean(self) -> NDArrays | None: ...

    def sums(self) -> NDArrays: ...

    def close(self) -> None: ...

    def add(self, arrays: NDArrays, weight: float) -> None:
        """Fold one update. Raises `UpdateRejected`; then nothing is added."""
        rejected = self.add_many([(arrays, weight)])
        if rejected:
            raise UpdateRejected(rejected[0][1])

    def landing(self, size: int) -> Any:
        """Where the transport may receive an update of `size` bytes: a writable buffer the
        accumulator folds from without copying (the tree's shared memory), or None (the
        transport's own buffer, the default)."""
        return None

    def name_updates(self, names: Sequence[str]) -> None:
        """Names for the next updates, for rejections reported late (none by default)."""

    def settle(self) -> list[tuple[str, str]]:
        """Rejections found after `add_many` returned, as (name, reason): none by default."""
        return []
