"""Clocks. Time is passed in: a shell reads its clock and hands `now` down, and a runtime is
given the clock it reads. The wall clock is `time.time`; `VirtualClock` is the one the
simulator and the control plane's tests in virtual time move by hand."""

from __future__ import annotations


class VirtualClock:
    """Seconds that pass only when told: `clock()` reads it, `to(t)` moves it on."""

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def to(self, t: float) -> None:
        """Move to `t`; never back."""
        if t < self.now:
            raise ValueError(f"VirtualClock.to: time runs forward only ({t!r} < {self.now!r})")
        self.now = t
