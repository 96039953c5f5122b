"""A control plane's loop: the one driver (plinth.sched.driver) turned on the control plane's
clock, from a thread of its own or by hand, and what it records.

Each `step` polls the runtime, takes in new submissions, and has the driver turn the owner
and carry out its output; every output is recorded first (`record`): its transitions are
written to the store before any of its instructions runs, so a control plane killed at any
point restarts with nothing lost (plinth.control.recovery). The thread (`start`) wakes on a
submission, on a runtime event and at the next time the driver names (a timer, a pass put
off), and otherwise sleeps; without it, a caller on a virtual clock steps whenever
`next_step_at` is due (tests/control/virtual.py does, with the simulated runtime).

Part of `plinth.control.service.ControlPlane`, which answers for it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from plinth.control.store import Event, Transition
from plinth.core.lifecycle import State
from plinth.core.runtime import EventKind
from plinth.sched import owner as o
from plinth.sched.driver import Driver, Pacer

if TYPE_CHECKING:
    from plinth.control.service import ControlPlane

log = logging.getLogger("plinth.control")

# How often the runtime's nodes are read again, to follow nodes that leave and come back.
NODE_CHECK_S = 2.0
# With nothing else to wake it, the loop still steps this often (a safety net).
IDLE_STEP_S = 1.0


class Loop:
    def __init__(self, cp: ControlPlane, *, paced: bool) -> None:
        """`paced`: passes spaced on the wall clock (plinth.sched.driver.Pacer); off on a
        virtual clock, where a pass takes no time."""
        self.cp = cp
        self.driver = Driver(cp.owner, cp.runtime, clock=cp.clock,
                             launch_spec=cp.launches.spec, grace_s=cp.grace_s,
                             record=self.record, launched=cp.launches.launched,
                             on_pass=cp.metrics.scheduled, pacer=Pacer() if paced else None,
                             wake=self.notify if paced else None)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._nodes_due = time.monotonic() + NODE_CHECK_S  # the next look at runtime.nodes()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="plinth-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.driver.close()

    def notify(self) -> None:
        self._wake.set()

    def next_step_at(self) -> float | None:
        """When `step` is next due: now if something waits (a submission, a runtime report),
        else the driver's next time (a timer, held jobs to look at again, a pass put off, a
        virtual runtime's next event); None: not until something comes."""
        if self._wake.is_set():
            return self.cp.clock()
        return self.driver.next_time()

    def step(self) -> None:
        """One turn: runtime events and submissions in, a pass if one is needed and due, the
        owner's output carried out (see plinth.sched.driver)."""
        cp = self.cp
        with cp._lock:
            self._wake.clear()  # what comes from here on wakes the next step
            now = cp.clock()
            reports = cp.runtime.poll()
            # A lost attempt may be the first sign of a node that left: look at once, so that
            # the requeued job is not placed there again. (A runtime whose nodes are fixed,
            # the local one, is not asked.)
            if "elastic" in cp.runtime.capabilities and (
                    time.monotonic() >= self._nodes_due
                    or any(r.kind is EventKind.LOST for r in reports)):
                self._follow_nodes()
            self.driver.turn([*self.driver.launches_done(now), *self.driver.events(reports, now),
                              *cp.take_incoming()], now)
            cp.workloads.tick(now)

    def _run(self) -> None:
        cp = self.cp
        while not self._stopping.is_set():
            with cp._lock:
                due = self.next_step_at()
                timeout = max(0.0, due - cp.clock()) if due is not None else IDLE_STEP_S
            self._wake.wait(min(timeout, IDLE_STEP_S))  # runtime events wake it too
            if self._stopping.is_set():
                break
            try:
                self.step()
            except Exception:
                log.exception("control loop step failed")

    def _follow_nodes(self) -> None:
        """Take the nodes that have left the runtime out of the scheduler's view, and put back
        those that have returned (see plinth.sched.nodes); their jobs end as the runtime reports
        them lost. A node the cluster did not have before joins it, after the others."""
        cp = self.cp
        self._nodes_due = time.monotonic() + NODE_CHECK_S
        try:
            nodes = cp.runtime.nodes()
        except Exception as e:  # noqa: BLE001 -- its cluster did not answer: look again later
            log.warning("the runtime's nodes could not be read: %s", e)
            return
        live = {n.name for n in nodes}
        known = {n.name for n in cp.cluster.nodes}
        joined = [n for n in nodes if n.name not in known]
        if joined:
            for n in joined:
                log.warning("node %s joined the cluster", n.name)
            cp.add_nodes(joined)
        names = [n.name for n in cp.cluster.nodes]
        down = frozenset(i for i, name in enumerate(names) if name not in live)
        was = cp.owner.down.nodes
        for i in sorted(down - was):
            log.warning("node %s left the cluster: its jobs are lost and requeued, and nothing "
                        "is placed on it until it is back", names[i])
        for i in sorted(was - down):
            log.warning("node %s is back in the cluster", names[i])
        cp.owner.set_down(down)

    # --- recording the owner's output ---------------------------------------------------------

    def record(self, out: o.Output) -> None:
        """Store every transition of `out` (before the driver carries out its instructions),
        and the checkpoints it saw."""
        cp = self.cp
        moves: list[Transition] = []  # written together: one transaction, not one each
        for t in out.transitions:
            self._store(t, moves)
        cp.store.transitions(moves)
        for js in out.checkpoints:
            cp.store.update_job(js.id, checkpoint_step=js.checkpoint_step,
                                checkpoint_time=js.checkpoint_time)
        for r in out.rejected:
            if not isinstance(r.event, o.Cancelled):
                log.warning("%s", r.message)
        if out.held_examined:
            cp.metrics.held_examined(out.held_examined)

    def _store(self, t: o.Transition, moves: list[Transition]) -> None:
        """Record `t`: a move between states joins `moves` (the caller writes them); a change
        within a state is written now, after the moves before it."""
        cp = self.cp
        fields = dict(t.fields)
        if "allocation" in fields:
            a = fields["allocation"]
            fields["allocation"] = a.to_dict() if a is not None else None
            fields["handle"] = None
        if t.new.terminal or t.new is State.PENDING:
            cp.launches.handles.pop(t.job_id, None)
        at = t.at
        if t.new.terminal:
            cp.specs.pop(t.job_id, None)
            cp.workloads.job_ended(t.job_id, t.new)
            ended = self.driver.ended_at.pop(t.job_id, None)
            if ended is not None and "end_time" in fields:
                at = fields["end_time"] = min(ended, t.at)
        if t.new is State.STOPPING and "reason" not in fields:
            fields["reason"] = f"stopping: {t.message}"
        if t.old is t.new:
            cp.store.transitions(moves)
            moves.clear()
            if fields:
                cp.store.update_job(t.job_id, **fields)
            cp.store.add_events([Event(t.job_id, t.kind, t.message)], t.at)
        else:
            moves.append(Transition(t.job_id, t.old, t.new, at, t.kind, t.message, fields))
