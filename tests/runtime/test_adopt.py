"""Re-adopting workers after the control plane restarts: pid plus start time, exit files, LOST."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import psutil
from conftest import JOB, PY, REPO, sh, spec, wait_events, wait_for

from plinth import job
from plinth.runtime import EventKind, Handle, ProcRef


def _gated(tmp_path, code: int) -> tuple[str, ...]:
    """A worker that waits for the file `go`, then exits with `code`."""
    return sh(f"while [ ! -e {tmp_path / 'go'} ]; do sleep 0.02; done; exit {code}")


def _round_trip(h: Handle) -> Handle:
    return Handle.from_dict(json.loads(json.dumps(h.to_dict())))


def test_adopt_after_close_sees_the_exit(make_rt, tmp_path):
    first = make_rt(fake_gpus="2xA100")
    h = first.launch(spec(tmp_path, _gated(tmp_path, 5), workers=2))
    first.close()  # the workers keep running
    assert all(psutil.pid_exists(p.pid) for p in h.procs)
    second = make_rt(fake_gpus="2xA100")
    assert second.adopt(_round_trip(h)) is True
    assert second.adopt(_round_trip(h)) is True  # twice is harmless
    (tmp_path / "go").touch()
    [ev] = wait_events(second)
    assert (ev.job_id, ev.kind, ev.exit_code) == (JOB, EventKind.EXITED, 5)


def test_adopt_workers_of_a_killed_control_plane(make_rt, tmp_path):
    # Another process launches and dies without closing anything, as under SIGKILL: its workers
    # are no longer anyone's children here, so they are watched through psutil.
    home = tmp_path / "home"
    script = textwrap.dedent(f"""
        import json, os, sys
        from pathlib import Path
        from plinth.runtime import LaunchSpec, LocalRuntime, WorkerLaunch
        rt = LocalRuntime(Path({str(home)!r}))
        h = rt.launch(LaunchSpec({JOB}, 2, {_gated(tmp_path, 3)!r}, (WorkerLaunch(0, "localhost"),),
                                 {str(tmp_path / "job.log")!r}))
        print(json.dumps(h.to_dict()), flush=True)
        os._exit(0)
    """)
    out = subprocess.run([PY, "-c", script], capture_output=True, text=True, cwd=REPO,
                         check=True).stdout
    h = Handle.from_dict(json.loads(out))
    rt = make_rt()
    assert rt.adopt(h) is True
    assert psutil.Process(h.procs[0].pid).ppid() != os.getpid()
    rt.stop(JOB, 2, grace_s=30)  # stop works on adopted workers too
    [ev] = wait_events(rt)
    assert (ev.attempt, ev.kind, ev.exit_code) == (2, EventKind.EXITED, 143)
    # An adopted worker's end is dated by its exit file, not by the tick that saw it (under
    # load a shim can outlive its exit file by seconds, and the job's end time would slip).
    assert ev.at == os.stat(h.procs[0].exit_file).st_mtime


def test_adopt_of_an_ended_attempt_reports_its_exit_code(make_rt, tmp_path):
    rt = make_rt()
    h = rt.launch(spec(tmp_path, sh("exit 4")))
    wait_events(rt)
    rt.close()
    again = make_rt()
    assert again.adopt(_round_trip(h)) is False
    [ev] = again.poll()
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, 4)


def test_dead_pid_without_exit_file_is_lost(make_rt, tmp_path):
    p = subprocess.Popen(["true"])
    start = psutil.Process(p.pid).create_time()
    p.wait()
    rt = make_rt()
    h = Handle(JOB, 1, (ProcRef(p.pid, start, str(tmp_path / "missing.exit")),))
    assert rt.adopt(h) is False
    [ev] = rt.poll()
    assert ev.kind is EventKind.LOST and ev.exit_code is None and "rank 0" in ev.message


def test_reused_pid_is_not_adopted(make_rt, tmp_path):
    # A live pid whose start time does not match is some other process: never watched or
    # signalled. This test's own process stands in for it.
    me = psutil.Process(os.getpid())
    rt = make_rt()
    h = Handle(JOB, 1, (ProcRef(me.pid, me.create_time() - 100, str(tmp_path / "x.exit")),))
    assert rt.adopt(h) is False
    [ev] = rt.poll()
    assert ev.kind is EventKind.LOST
    rt.stop(JOB, 1, 0)  # nothing is watched, so nothing is signalled
    wait_for(lambda: True, "nothing")
    assert me.is_running()


def test_a_worker_is_recognised_by_its_boot_ticks_when_the_wall_clock_was_stepped(make_rt,
                                                                                   tmp_path):
    # A VM resumed from a snapshot, or NTP stepping the clock, moves the boot time that start
    # times are derived from: every live worker looked like another process and was requeued
    # (seen in the full suite: all adoptions within 15 s of a VM fork failed). The kernel's
    # start ticks since boot do not move.
    first = make_rt()
    h = first.launch(spec(tmp_path, sh("exec sleep 120")))
    first.close()
    (ref,) = h.procs
    assert ref.start_ticks > 0
    stepped = Handle(JOB, h.attempt, (ProcRef(ref.pid, ref.start_time + 1.0, ref.exit_file,
                                              ref.start_ticks),))
    second = make_rt()
    assert second.adopt(_round_trip(stepped)) is True
    second.stop(JOB, h.attempt, grace_s=30)
    [ev] = wait_events(second)
    assert ev.kind is EventKind.EXITED


def test_a_pid_reused_with_the_same_wall_start_is_told_apart_by_its_ticks(make_rt, tmp_path):
    me = psutil.Process(os.getpid())
    rt = make_rt()
    from plinth.runtime.local import start_ticks

    other = ProcRef(me.pid, me.create_time(), str(tmp_path / "x.exit"), start_ticks(me.pid) + 1)
    assert rt.adopt(Handle(JOB, 1, (other,))) is False
    [ev] = rt.poll()
    assert ev.kind is EventKind.LOST
    assert me.is_running()


def test_gang_member_failed_while_down_stops_the_rest(make_rt, tmp_path):
    first = make_rt()
    go = tmp_path / "go"
    h = first.launch(spec(tmp_path, sh(f'if [ "$RANK" = 1 ]; then while [ ! -e {go} ]; do '
                                       f'sleep 0.02; done; exit 3; fi; exec sleep 120'),
                          workers=2))
    first.close()
    go.touch()  # rank 1 fails while no runtime watches
    wait_for(lambda: os.path.exists(h.procs[1].exit_file), "rank 1's exit file")
    second = make_rt()
    assert second.adopt(_round_trip(h)) is True  # rank 0 still runs
    [ev] = wait_events(second)
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, 3) and "rank 1" in ev.message


def test_handle_keeps_the_checkpoint_dir_and_old_handles_still_load(tmp_path):
    h = Handle(JOB, 2, (ProcRef(12, 3.5, "/x.exit"),), str(tmp_path / "ck"))
    assert _round_trip(h) == h
    old = {"job_id": JOB, "attempt": 2, "procs": [[12, 3.5, "/x.exit"]]}  # stored before
    assert Handle.from_dict(old) == Handle(JOB, 2, (ProcRef(12, 3.5, "/x.exit"),))
    assert Handle.from_dict(old).checkpoint_dir is None


def test_adopted_attempts_report_their_checkpoints(make_rt, tmp_path):
    # Both jobs save while no runtime watches: one is still running at adoption, the other has
    # exited. Each save is reported, before its attempt's end.
    prog = ("import os, sys, time; from plinth import job\n"
            "def wait(p):\n"
            "    while not os.path.exists(p): time.sleep(0.01)\n"
            "wait(sys.argv[1] + '-go'); job.report_checkpoint(int(sys.argv[2]))\n"
            "if sys.argv[2] == '8': wait(sys.argv[1] + '-end')\n")
    first = make_rt()
    a = first.launch(spec(tmp_path, (PY, "-c", prog, str(tmp_path / "a"), "8"),
                          checkpoint_dir=str(tmp_path / "ck-a")))
    b = first.launch(spec(tmp_path, (PY, "-c", prog, str(tmp_path / "b"), "9"), job_id=JOB + 1,
                          checkpoint_dir=str(tmp_path / "ck-b")))
    assert a.checkpoint_dir == str(tmp_path / "ck-a")
    first.close()
    (tmp_path / "a-go").touch()
    (tmp_path / "b-go").touch()
    wait_for(lambda: (tmp_path / "ck-a" / job.CHECKPOINT_MARKER).exists() and
             os.path.exists(b.procs[0].exit_file), "a's save and b's end")
    os.waitpid(b.procs[0].pid, 0)  # reaped, as by a control plane that died: b is gone
    second = make_rt()
    assert second.adopt(_round_trip(b)) is False
    assert [(e.kind, e.step) for e in second.poll()] == \
        [(EventKind.CHECKPOINTED, 9), (EventKind.EXITED, None)]
    assert second.adopt(_round_trip(a)) is True
    [ev] = wait_events(second)
    assert (ev.job_id, ev.kind, ev.step) == (JOB, EventKind.CHECKPOINTED, 8)
    (tmp_path / "a-end").touch()
    assert [e.kind for e in wait_events(second)] == [EventKind.EXITED]


def test_find_gives_an_unrecorded_launch_and_kills_a_half_started_gang(make_rt, tmp_path):
    """A control plane killed during a launch stored no handle: the runtime's journal gives it
    back whole, and kills a gang it started only part of (it would run on unwatched)."""
    first = make_rt(fake_gpus="2xA100")
    assert first.find(JOB, 1, 2) is None  # never launched
    h = first.launch(spec(tmp_path, _gated(tmp_path, 0), workers=2))
    first.close()
    second = make_rt(fake_gpus="2xA100")
    found = second.find(JOB, 1, 2)
    assert found == h
    # A control plane killed between a fork and its journal write leaves the journal without
    # the worker it had just forked: that worker is found by its running shim, not run twice.
    journal = tmp_path / "home" / "launched" / f"j{JOB}-a1.json"
    whole = json.loads(journal.read_text())
    journal.write_text(json.dumps({**whole, "procs": whole["procs"][:1]}))
    found = second.find(JOB, 1, 2)
    assert found is not None
    assert [(r.pid, r.start_ticks, r.exit_file) for r in found.procs] == \
        [(r.pid, r.start_ticks, r.exit_file) for r in h.procs]
    # Killed between the two forks: rank 1 never ran (no shim, no exit file), so the gang is
    # only half there, and rank 0 is killed.
    os.killpg(h.procs[1].pid, 9)
    wait_for(lambda: not psutil.pid_exists(h.procs[1].pid)
             or psutil.Process(h.procs[1].pid).status() == psutil.STATUS_ZOMBIE,
             "rank 1 to be killed")
    Path(h.procs[1].exit_file).unlink(missing_ok=True)
    assert second.find(JOB, 1, 2) is None
    wait_for(lambda: not psutil.pid_exists(h.procs[0].pid)
             or psutil.Process(h.procs[0].pid).status() == psutil.STATUS_ZOMBIE,
             "rank 0 to be killed")
    assert not journal.exists()


def test_a_launch_that_ended_before_it_was_recorded_is_found_ended(make_rt, tmp_path):
    """Killed before it stored the handle, and the job ended meanwhile (its journal already
    gone): its exit file still says so, so the job is not started a second time."""
    first = make_rt()
    first.launch(spec(tmp_path, sh("exit 3")))
    wait_events(first)
    first.close()
    second = make_rt()
    found = second.find(JOB, 1, 1)
    assert found is not None and second.adopt(found) is False
    assert [(e.kind, e.exit_code) for e in wait_events(second)] == [(EventKind.EXITED, 3)]


def test_an_ended_attempt_leaves_no_journal(make_rt, tmp_path):
    rt = make_rt()
    rt.launch(spec(tmp_path, sh("exit 0")))
    wait_events(rt)
    assert list((tmp_path / "home" / "launched").iterdir()) == []


def test_an_adopted_shim_killed_from_outside_leaves_nothing_running(make_rt, tmp_path):
    """kill -9 of an adopted worker's shim: the command it started is not our child and was
    left running while the job was requeued as lost, so it ran beside the next attempt."""
    first = make_rt()
    h = first.launch(spec(tmp_path, sh("echo $$ > " + str(tmp_path / "cmd.pid") +
                                       "; exec sleep 300")))
    first.close()
    second = make_rt()
    assert second.adopt(_round_trip(h)) is True
    cmd = int(wait_for(lambda: (tmp_path / "cmd.pid").exists()
                       and (tmp_path / "cmd.pid").read_text().strip(), "the command's pid"))
    os.kill(h.procs[0].pid, 9)
    [ev] = wait_events(second)
    assert ev.kind is EventKind.LOST
    wait_for(lambda: not psutil.pid_exists(cmd)
             or psutil.Process(cmd).status() == psutil.STATUS_ZOMBIE, "the command to be killed")
