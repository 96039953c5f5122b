"""The local runtime with real processes: exit codes, environment, stop, gangs, bad input,
checkpoint markers, and fake nodes of several GPU models."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from conftest import EXAMPLES, JOB, PY, sh, spec, wait_events, wait_for

from plinth import job
from plinth.core.errors import PlinthError
from plinth.runtime import EventKind, WorkerLaunch


@pytest.mark.parametrize(("script", "code"), [("exit 0", 0), ("exit 7", 7), ("kill -9 $$", 137)])
def test_exit_codes(rt, tmp_path, script, code):
    rt.launch(spec(tmp_path, sh(script)))
    [ev] = wait_events(rt)
    assert (ev.job_id, ev.attempt, ev.kind, ev.exit_code) == (JOB, 1, EventKind.EXITED, code)
    assert rt.poll() == [] and rt.running() == []


def test_log_gets_stdout_and_stderr_of_every_worker(rt, tmp_path):
    rt.launch(spec(tmp_path, sh("echo out $RANK; echo err $RANK >&2"), workers=2))
    wait_events(rt)
    lines = sorted((tmp_path / "job.log").read_text().split("\n"))
    assert lines == ["", "err 0", "err 1", "out 0", "out 1"]


def test_notify_is_called_when_events_are_ready(make_rt, tmp_path):
    calls = []
    rt = make_rt(notify=lambda: calls.append(1))
    rt.launch(spec(tmp_path, sh("exit 0")))
    wait_for(lambda: calls, "notify")
    assert [e.kind for e in rt.poll()] == [EventKind.EXITED]


def test_environment_of_workers(rt, tmp_path):
    dump = ("import json, os, sys; "
            "json.dump(dict(os.environ), open(sys.argv[1] + os.environ['RANK'], 'w'))")
    workers = (WorkerLaunch(0, "localhost", gpus=(0, 1)),
               WorkerLaunch(1, "localhost", gpus=(2,), gpu_milli=250, gpu_memory_mib=4096),
               WorkerLaunch(2, "localhost"))
    rt.launch(spec(tmp_path, (PY, "-c", dump, str(tmp_path / "env")), worker_list=workers,
                   job_id=JOB + 1, attempt=3, env={"MY_VAR": "x", "RANK": "ignored"},
                   checkpoint_dir=str(tmp_path / "ck")))
    [ev] = wait_events(rt)
    assert ev.exit_code == 0
    env = [json.loads((tmp_path / f"env{r}").read_text()) for r in range(3)]
    for r, e in enumerate(env):
        assert e["MY_VAR"] == "x"
        assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]) == (str(r), "3", str(r))
        assert (e["PLINTH_JOB_ID"], e["PLINTH_ATTEMPT"]) == (str(JOB + 1), "3")
        assert e["PLINTH_CHECKPOINT_DIR"] == str(tmp_path / "ck")
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == env[0]["MASTER_PORT"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in env] == ["0,1", "2", ""]
    assert env[1]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env[1]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env[1]["CUDA_MPS_PIPE_DIRECTORY"] == str(rt.mps.pipe_dir(2))
    assert not any(k.startswith("CUDA_MPS_") for k in env[0])  # whole GPUs: no MPS
    assert not (tmp_path / "ck").exists()  # made by the job when it first saves, not before
    assert not rt.mps_available and "fake" in rt.describe()


def test_stop_sends_sigterm_once_to_the_whole_group(rt, tmp_path):
    # The command and a child of its own both count the SIGTERMs they get, then exit.
    prog = ("import os, signal, sys, time\n"
            "n = []\n"
            "signal.signal(signal.SIGTERM, lambda *a: n.append(1))\n"
            "if os.fork() == 0:\n"
            "    name = 'child'\n"
            "else:\n"
            "    name = 'parent'\n"
            "open(sys.argv[1] + name + '.ready', 'w').close()\n"
            "while not n: time.sleep(0.01)\n"
            "time.sleep(0.3)\n"
            "open(sys.argv[1] + name, 'w').write(str(len(n)))\n"
            "if name == 'parent': os.wait()\n")
    rt.launch(spec(tmp_path, (PY, "-c", prog, str(tmp_path / "n-"))))
    wait_for(lambda: all((tmp_path / f"n-{w}.ready").exists() for w in ("parent", "child")),
             "handlers installed")
    rt.stop(JOB, 1, grace_s=30)
    [ev] = wait_events(rt)
    assert ev.exit_code == 0 and "stopped" in ev.message
    assert (tmp_path / "n-parent").read_text() == "1" and (tmp_path / "n-child").read_text() == "1"


def test_stop_kills_after_the_grace_period(rt, tmp_path):
    ready = tmp_path / "ready"
    prog = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open(sys.argv[1], 'w').close(); time.sleep(120)")
    rt.launch(spec(tmp_path, (PY, "-c", prog, str(ready))))
    wait_for(ready.exists, "SIGTERM to be ignored")
    rt.stop(JOB, 1, grace_s=0.3)  # returns at once; the watcher sends SIGKILL later
    assert rt.running() == [(JOB, 1)]
    [ev] = wait_events(rt)
    assert ev.kind is EventKind.EXITED and ev.exit_code == 137


def test_stop_of_a_plain_sleep_reports_sigterm(rt, tmp_path):
    rt.launch(spec(tmp_path, ("sleep", "120")))
    rt.stop(JOB, 1, grace_s=30)
    [ev] = wait_events(rt)
    assert ev.exit_code == 128 + signal.SIGTERM
    rt.stop(JOB, 1, grace_s=30)  # already ended: nothing to do


def test_stop_right_after_launch_still_leaves_an_exit_code(rt, tmp_path):
    # The shim starts with SIGTERM blocked until its handler is in place, so even a stop that
    # comes while Python is starting is recorded in the exit file (which adoption relies on).
    h = rt.launch(spec(tmp_path, ("sleep", "120")))
    rt.stop(JOB, 1, grace_s=30)
    [ev] = wait_events(rt)
    assert ev.exit_code == 143
    assert Path(h.procs[0].exit_file).read_text() == "143\n"


def test_leftover_background_processes_are_killed(rt, tmp_path):
    pidfile = tmp_path / "bg"
    rt.launch(spec(tmp_path, sh(f"sleep 120 & echo $! > {pidfile}; exit 0")))
    [ev] = wait_events(rt)
    assert ev.exit_code == 0
    pid = int(pidfile.read_text())
    wait_for(lambda: not psutil.pid_exists(pid) or
             psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, "background sleep to die")


def test_gang_worker_failure_stops_the_others(rt, tmp_path):
    rt.launch(spec(tmp_path, sh('if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 120'),
                   workers=3))
    [ev] = wait_events(rt)
    assert ev.kind is EventKind.EXITED and ev.exit_code == 3
    assert "rank 1 exited with 3" in ev.message


def test_gang_ddp_example_with_gloo(make_rt, tmp_path):
    rt = make_rt()  # no GPUs at all: CPU workers
    rt.launch(spec(tmp_path, (PY, str(EXAMPLES / "gang_ddp.py"), "--steps", "3"), workers=2))
    [ev] = wait_events(rt)
    log = (tmp_path / "job.log").read_text()
    assert ev.exit_code == 0, (ev, log, [f.read_text() for f in (tmp_path / "home" / "exit").iterdir()])
    assert "all_reduce sum = 3 (expected 3), world 2, weights equal on all ranks: True" in log


@pytest.mark.parametrize(("change", "field"), [
    ({"command": ()}, "command is empty"),
    ({"command": ("no-such-program-xyz",)}, "command[0]: 'no-such-program-xyz'"),
    ({"worker_list": (WorkerLaunch(0, "elsewhere"),)}, "workers[0].node"),
    ({"worker_list": (WorkerLaunch(0, "localhost", gpus=(9,)),)}, "workers[0].gpus: no GPU 9"),
    ({"worker_list": (WorkerLaunch(0, "localhost", gpus=(0, 1), gpu_milli=500),)},
     "needs exactly one GPU"),
    ({"worker_list": (WorkerLaunch(1, "localhost"),)}, "ranks must be 0..0"),
    ({"workdir": "/no/such/dir"}, "workdir"),
])
def test_bad_launch_specs_are_refused(rt, tmp_path, change, field):
    kw = {"command": sh("exit 0"), **change}
    with pytest.raises(PlinthError, match=None) as e:
        rt.launch(spec(tmp_path, kw.pop("command"), **kw))
    assert field in str(e.value) and "\n" not in str(e.value)
    assert rt.running() == []


def test_launch_is_all_or_nothing(make_rt, tmp_path):
    # A plain directory stands in for a delegated cgroup; a file where worker 1's cgroup must go
    # makes worker 1 fail to start after worker 0 has started.
    fake_cg = tmp_path / "cg"
    fake_cg.mkdir()
    rt = make_rt(cgroup_parent=fake_cg)
    assert rt.isolation == "cgroup2"
    (fake_cg / "plinth" / f"j{JOB}-a1-r1").write_text("in the way")
    pidfile = tmp_path / "pid0"
    with pytest.raises(PlinthError, match="worker rank 1 did not start"):
        rt.launch(spec(tmp_path, sh(f'[ "$RANK" = 0 ] && echo $$ > {pidfile}; exec sleep 120'),
                       workers=2, worker_list=(WorkerLaunch(0, "localhost", memory_mib=512),
                                               WorkerLaunch(1, "localhost", memory_mib=512))))
    assert rt.running() == []
    if pidfile.exists():  # worker 0 got as far as its command: it must be gone now
        assert not psutil.pid_exists(int(pidfile.read_text()))


def test_same_attempt_twice_is_refused(rt, tmp_path):
    rt.launch(spec(tmp_path, ("sleep", "120")))
    with pytest.raises(PlinthError, match="already running"):
        rt.launch(spec(tmp_path, ("sleep", "120")))


def test_nodes_describe_this_machine(make_rt):
    rt = make_rt(fake_gpus="2xH100", node_name="box")
    [n] = rt.nodes()
    assert (n.name, n.gpu_model, n.num_gpus) == ("box", "H100", 2)
    assert n.cpus_milli == 1000 * len(os.sched_getaffinity(0))
    assert n.memory_mib > 0
    assert make_rt().nodes()[0].num_gpus == len(make_rt().gpus)


def test_a_shim_killed_from_outside_is_lost(rt, tmp_path):
    # kill -9 of the shim (the command's parent) leaves no exit code: not 137, which would say
    # the command was killed, but lost, as an adopted worker that vanished is.
    rt.launch(spec(tmp_path, sh("kill -9 $PPID; exec sleep 120")))
    [ev] = wait_events(rt)
    assert (ev.kind, ev.exit_code) == (EventKind.LOST, None)


# ------------------------------------------------------------------------- checkpoint markers

MARKER = job.CHECKPOINT_MARKER


def _marker_job(tmp_path, bad: list[bytes]) -> tuple[str, ...]:
    """A job that writes each of `bad` as its marker in turn, each time waiting for the file
    `go<i>`, then reports step 5 and exits."""
    prog = ("import os, sys, time; from plinth import job\n"
            "d = job.checkpoint_dir()\n"
            "for i, raw in enumerate(eval(sys.argv[2])):\n"
            "    open(d / 'tmp', 'wb').write(raw)\n"
            "    os.replace(d / 'tmp', d / job.CHECKPOINT_MARKER)\n"
            "    while not os.path.exists(sys.argv[1] + str(i)): time.sleep(0.01)\n"
            "job.report_checkpoint(5)\n")
    return (PY, "-c", prog, str(tmp_path / "go"), repr(bad))


def test_malformed_markers_are_ignored_and_reported(rt, tmp_path):
    bad = [b"{not json", json.dumps({"step": "3", "attempt": 1, "time": 1e9}).encode(),
           json.dumps({"step": 3, "attempt": 1}).encode(), b" " * 10_000]
    ck = tmp_path / "ck"
    ck.mkdir()
    rt.launch(spec(tmp_path, _marker_job(tmp_path, bad), checkpoint_dir=str(ck)))
    for i in range(len(bad)):
        wait_for(lambda i=i: len([p for p in rt.problems if MARKER in p]) == i + 1,
                 f"bad marker {i} to be reported")
        (tmp_path / f"go{i}").touch()
    evs = wait_events(rt, 2)
    assert [(e.kind, e.step) for e in evs] == \
        [(EventKind.CHECKPOINTED, 5), (EventKind.EXITED, None)]
    assert evs[1].exit_code == 0
    lines = [p for p in rt.problems if MARKER in p]
    assert len(lines) == len(bad)  # one line each, not one per tick
    assert all(f"job {JOB} attempt 1" in p and str(ck / MARKER) in p for p in lines)
    assert "not JSON" in lines[0] and "step" in lines[1] and "time" in lines[2]
    assert "10000 bytes" in lines[3]
    assert all(p in rt.describe() for p in lines)


def test_an_earlier_attempts_marker_is_not_reported(rt, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    report = (PY, "-c", "from plinth import job; job.report_checkpoint(4)")
    rt.launch(spec(tmp_path, report, checkpoint_dir=str(ck)))
    assert [e.kind for e in wait_events(rt, 2)] == [EventKind.CHECKPOINTED, EventKind.EXITED]
    # Attempt 2 finds attempt 1's marker; a marker claiming attempt 3 but written before it
    # started (by an earlier run with the same numbers) is not its either.
    rt.launch(spec(tmp_path, ("sleep", "0.3"), attempt=2, checkpoint_dir=str(ck)))
    assert [e.kind for e in wait_events(rt)] == [EventKind.EXITED]
    (ck / MARKER).write_text(json.dumps({"step": 9, "attempt": 3, "time": time.time() - 60}))
    rt.launch(spec(tmp_path, ("sleep", "0.3"), attempt=3, checkpoint_dir=str(ck)))
    assert [e.kind for e in wait_events(rt)] == [EventKind.EXITED]
    assert not rt.problems


def test_a_marker_touched_again_is_not_a_new_checkpoint(rt, tmp_path):
    ck = tmp_path / "ck"
    go = tmp_path / "go"
    prog = ("import os, sys, time; from plinth import job\n"
            "job.report_checkpoint(2)\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n")
    rt.launch(spec(tmp_path, (PY, "-c", prog, str(go)), checkpoint_dir=str(ck)))
    [ev] = wait_events(rt)
    assert ev.step == 2
    os.utime(ck / MARKER, ns=(time.time_ns() + 10**9,) * 2)  # same content, new mtime
    time.sleep(0.3)  # several ticks for a wrong event to show up
    go.touch()
    assert [e.kind for e in wait_events(rt)] == [EventKind.EXITED]


# ------------------------------------------------------------------------- fake nodes

def test_fake_gpus_of_two_models_make_two_nodes(make_rt):
    rt = make_rt(fake_gpus="2xA100,3xV100")
    nodes = rt.nodes()
    assert [(n.name, n.gpu_model, n.num_gpus) for n in nodes] == \
        [("localhost-a100", "A100", 2), ("localhost-v100", "V100", 3)]
    one = make_rt(fake_gpus="5xA100").nodes()[0]
    assert sum(n.cpus_milli for n in nodes) == one.cpus_milli  # the machine, shared out
    assert sum(n.memory_mib for n in nodes) == one.memory_mib
    assert nodes[0].memory_mib <= nodes[1].memory_mib  # in proportion to their GPUs
    text = rt.describe()
    assert "localhost-a100: " in text and "2xA100 (fake)" in text and "3xV100 (fake)" in text


def test_gpus_are_local_to_their_fake_node(make_rt, tmp_path):
    rt = make_rt(fake_gpus="2xA100,2xV100")
    dump = ("import json, os, sys; "
            "json.dump(dict(os.environ), open(sys.argv[1] + os.environ['RANK'], 'w'))")
    workers = (WorkerLaunch(0, "localhost-a100", gpus=(0, 1)),
               WorkerLaunch(1, "localhost-v100", gpus=(1,)),
               WorkerLaunch(2, "localhost-v100", gpus=(0,), gpu_milli=500))
    rt.launch(spec(tmp_path, (PY, "-c", dump, str(tmp_path / "env")), worker_list=workers))
    [ev] = wait_events(rt)
    assert ev.exit_code == 0
    env = [json.loads((tmp_path / f"env{r}").read_text()) for r in range(3)]
    # The machine numbers the fake GPUs 0-1 (A100) and 2-3 (V100).
    assert [e["CUDA_VISIBLE_DEVICES"] for e in env] == ["0,1", "3", "2"]
    assert env[2]["CUDA_MPS_PIPE_DIRECTORY"] == str(rt.mps.pipe_dir(2))
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in env] == \
        [("0", "1"), ("0", "2"), ("1", "2")]  # counted per node
    assert len({e["MASTER_PORT"] for e in env}) == 1


@pytest.mark.parametrize(("worker", "field"), [
    (WorkerLaunch(0, "localhost"), "'localhost' is not a node here ('localhost-a100', "),
    (WorkerLaunch(0, "localhost-v100", gpus=(2,)), "no GPU 2 on localhost-v100 (2 GPUs)"),
])
def test_workers_on_fake_nodes_are_checked(make_rt, tmp_path, worker, field):
    rt = make_rt(fake_gpus="2xA100,2xV100")
    with pytest.raises(PlinthError) as e:
        rt.launch(spec(tmp_path, sh("exit 0"), worker_list=(worker,)))
    assert field in str(e.value)


def test_one_model_is_one_node_as_before(make_rt):
    assert [n.name for n in make_rt(fake_gpus="2xV100").nodes()] == ["localhost"]
    assert [n.name for n in make_rt().nodes()] == ["localhost"]


def test_a_fifo_as_the_marker_stalls_nothing(make_rt, tmp_path):
    """A FIFO where the checkpoint marker goes blocked the one watcher thread (an open for
    reading waits for a writer): no other job's end was seen after it."""
    rt = make_rt()
    ckpt = tmp_path / "ckpt"
    rt.launch(spec(tmp_path, sh(f'mkdir -p {ckpt} && mkfifo {ckpt}/{MARKER} && exec sleep 300'),
                   checkpoint_dir=str(ckpt)))
    wait_for(lambda: (ckpt / MARKER).exists(), "the planted FIFO")
    rt.launch(spec(tmp_path, sh("exit 4"), job_id=JOB + 1))
    [ev] = wait_events(rt)
    assert (ev.job_id, ev.kind, ev.exit_code) == (JOB + 1, EventKind.EXITED, 4)
    wait_for(lambda: any("not a regular file" in p for p in rt.problems), "the FIFO reported")
    rt.stop(JOB, 1, grace_s=0)
    [ev] = wait_events(rt)
    assert (ev.job_id, ev.kind) == (JOB, EventKind.EXITED)
