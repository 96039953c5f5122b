"""Re-adopting workers after the control plane restarts: pid plus start time, exit files, LOST."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import psutil
from conftest import JOB, PY, REPO, sh, spec, wait_events, wait_for

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
