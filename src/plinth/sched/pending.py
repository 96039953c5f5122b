"""Pending queues that tell a policy how they changed, for policies that keep counts of them.

The owner keeps the pending queue a policy makes (`Policy.pending_queue`) and changes it one
job at a time (add, remove). A `WatchedQueue` calls `added` and `removed` for those and
`changed` for anything else (update, pop, clear, ...), after which a subclass's counts are
unknown.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

from sortedcontainers import SortedKeyList

from plinth.sched.types import JobState


class WatchedQueue(SortedKeyList):
    def __init__(self, iterable: Iterable[JobState] = (),
                 key: Callable[[JobState], tuple] | None = None) -> None:
        super().__init__(key=key)
        values = list(iterable)
        SortedKeyList.update(self, values)
        for value in values:
            self.added(value)

    def added(self, value: JobState) -> None:
        """`value` was added on its own."""

    def removed(self, value: JobState) -> None:
        """`value` was removed on its own."""

    def changed(self) -> None:
        """Some other change is about to be made."""

    def add(self, value: JobState) -> None:
        super().add(value)
        self.added(value)

    def remove(self, value: JobState) -> None:
        super().remove(value)
        self.removed(value)

    def discard(self, value: JobState) -> None:
        if value in self:
            self.remove(value)

    def _bulk(name: str) -> Callable:  # type: ignore[misc]  # (a helper of the class body)
        def watched(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.changed()
            return getattr(SortedKeyList, name)(self, *args, **kwargs)
        return watched

    update = _bulk("update")
    clear = _bulk("clear")
    pop = _bulk("pop")
    __delitem__ = _bulk("__delitem__")
    __iadd__ = _bulk("__iadd__")
    __imul__ = _bulk("__imul__")
    del _bulk


class GpulessCount(WatchedQueue):
    """Counting each tenant's waiting jobs that ask for no GPU (`gpuless`; None: unknown since
    a change other than add or remove). DRF reads it: a tenant with none whose quota is spent
    has no job that can start."""

    def __init__(self, iterable: Iterable[JobState] = (),
                 key: Callable[[JobState], tuple] | None = None) -> None:
        self.gpuless: collections.Counter[str] | None = collections.Counter()
        super().__init__(iterable, key=key)

    def added(self, value: JobState) -> None:
        if self.gpuless is not None and not value.job.request.gpu_milli_total:
            self.gpuless[value.job.tenant] += 1

    def removed(self, value: JobState) -> None:
        if self.gpuless is not None and not value.job.request.gpu_milli_total:
            self.gpuless[value.job.tenant] -= 1

    def changed(self) -> None:
        self.gpuless = None


class ChangeCount(WatchedQueue):
    """Counting the jobs added to or removed from each group of the queue (`changes[g]`, g
    the first field of the sort key), and every other change (`epoch`). Tiresias reads it:
    while a queue's count stays the same, so do its jobs."""

    def __init__(self, iterable: Iterable[JobState] = (),
                 key: Callable[[JobState], tuple] | None = None) -> None:
        self.changes: collections.Counter[int] = collections.Counter()
        self.epoch = 0
        super().__init__(iterable, key=key)

    def added(self, value: JobState) -> None:
        self.changes[self.key(value)[0]] += 1

    removed = added

    def changed(self) -> None:
        self.epoch += 1
