"""The shim on its own: exit codes as a shell reports them, written atomically; the command,
its environment and its folder reach only a child that has dropped to the job's user; and the
log stops growing at its limit. Each promise is attacked as a tenant would."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest
from conftest import PY, wait_for

from plinth.runtime.procs import SHIM, start_shim

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")


def _shim(exit_file: Path, launch: dict, *opts: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-I", SHIM, *opts, str(exit_file)], input=json.dumps(launch),
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize(("argv", "code"), [
    (["/bin/sh", "-c", "exit 0"], 0),
    (["/bin/sh", "-c", "exit 9"], 9),
    (["/bin/sh", "-c", "kill -TERM $$"], 143),
    (["/no/such/program"], 127),
])
def test_exit_code_file(tmp_path, argv, code):
    exit_file = tmp_path / "exit"
    r = _shim(exit_file, {"argv": argv, "env": {}, "cwd": None, "user": None})
    assert r.returncode == code and exit_file.read_text() == f"{code}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["exit"]


def test_usage_error(tmp_path):
    r = subprocess.run([PY, "-I", SHIM], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "usage" in r.stderr
    r = _shim(tmp_path / "exit", {}, "--log-limit")  # an option without its value
    assert r.returncode == 2 and "usage" in r.stderr


def test_the_command_gets_its_env_and_folder_and_the_shim_does_not(tmp_path):
    launch = {"argv": ["sh", "-c", 'echo "$PLINTH_X $(pwd)"'], "env": {"PLINTH_X": "spec-value",
              "PATH": os.defpath}, "cwd": str(tmp_path), "user": None}
    r = _shim(tmp_path / "exit", launch)
    assert r.returncode == 0 and r.stdout == f"spec-value {tmp_path}\n"


def test_a_command_that_cannot_start_says_which_field(tmp_path):
    r = _shim(tmp_path / "exit", {"argv": ["true"], "env": {"PATH": os.defpath},
                                  "cwd": str(tmp_path / "gone"), "user": None})
    assert r.returncode == 126 and r.stdout.startswith("plinth shim: workdir: cannot start")


def test_the_log_is_cut_at_its_limit(tmp_path):
    log = tmp_path / "log"
    launch = {"argv": [PY, "-c", "import os\nfor _ in range(64): os.write(1, b'x' * 65536)"],
              "env": {}, "cwd": None, "user": None}
    with open(log, "wb") as out:
        r = subprocess.run([PY, "-I", SHIM, "--log-limit", "100000", str(tmp_path / "exit")],
                           input=json.dumps(launch).encode(), stdout=out, check=False)
    assert r.returncode == 0  # the job was not hurt by the cut: its writes all succeeded
    text = log.read_bytes()
    assert text.startswith(b"x" * 100_000) and b"[plinth] log cut at 100000 bytes" in text
    assert len(text) < 100_200


@pytest.fixture
def open_dir():
    """A folder every user can reach (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="plinth-shim-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@as_root
def test_ld_preload_from_the_spec_never_runs_as_root(open_dir):
    """The report's attack: a library of the tenant's own in LD_PRELOAD, which the dynamic
    loader of a root process (the shim, setpriv) loaded before privileges dropped."""
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the attacker's library")
    uids = open_dir / "uids"
    uids.touch(mode=0o666)
    uids.chmod(0o666)
    src = open_dir / "evil.c"
    src.write_text('#include <stdio.h>\n#include <unistd.h>\n'
                   '__attribute__((constructor)) static void evil(void) {\n'
                   f'  FILE *f = fopen("{uids}", "a"); if (f) {{ fprintf(f, "%d\\n", getuid()); '
                   'fclose(f); } }\n')
    lib = open_dir / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    launch = {"argv": ["/bin/true"], "env": {"LD_PRELOAD": str(lib), "PATH": os.defpath},
              "cwd": None, "user": [65534, 65534, [65534]]}
    r = _shim(open_dir / "exit", launch)
    assert r.returncode == 0, r.stdout + r.stderr
    # The library ran, in the command only, as the job's user: the attack was live.
    assert uids.read_text().split() == ["65534"]


@as_root
def test_the_workdir_is_entered_as_the_jobs_user(open_dir):
    """As root, `workdir: /root/...` told a tenant whether the path exists; as the tenant, a
    path behind a closed folder is denied whether or not it is there."""
    closed = open_dir / "closed"
    (closed / "there").mkdir(parents=True)
    closed.chmod(0o700)
    outs = []
    for name in ("there", "not-there"):
        launch = {"argv": ["/bin/true"], "env": {}, "cwd": str(closed / name),
                  "user": [65534, 65534, [65534]]}
        r = _shim(open_dir / "exit", launch)
        outs.append((r.returncode, r.stdout.split(": cannot start: ")[0],
                     "Permission denied" in r.stdout))
    assert outs == [(126, "plinth shim: workdir", True)] * 2


def test_the_command_line_is_not_in_the_shims_argv(tmp_path):
    """Other tenants' command lines showed in `ps` through the (root) shim's argv."""
    exit_file = tmp_path / "exit"
    p = start_shim(str(exit_file), command=[PY, "-c", "import time; time.sleep(30)", "--secret-flag"],
                   env={"PATH": os.defpath}, workdir=None, log_path=str(tmp_path / "log"))
    try:
        child = wait_for(lambda: next(iter(psutil.Process(p.pid).children()), None),
                         what="the shim's command")
        assert wait_for(lambda: child.cmdline()[-1:] == ["--secret-flag"],
                        what="the command's exec")  # the command's own argv is its own
        assert psutil.Process(p.pid).cmdline()[-1] == str(exit_file)
        assert not any("secret" in a for a in psutil.Process(p.pid).cmdline())
        assert "PATH" not in psutil.Process(p.pid).environ()
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def test_a_writer_left_behind_does_not_keep_the_shim(tmp_path):
    """The command ends, but what it started in the background writes on without end: the
    shim still ends with the command's code (the runtime then kills what is left)."""
    launch = {"argv": ["/bin/sh", "-c", "(while :; do echo spam; done) & exit 5"],
              "env": {"PATH": os.defpath}, "cwd": None, "user": None}
    p = subprocess.Popen([PY, "-I", SHIM, str(tmp_path / "exit")], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        p.communicate(json.dumps(launch).encode(), timeout=60)
        assert p.returncode == 5 and (tmp_path / "exit").read_text() == "5\n"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, 9)


def test_with_parent_the_command_dies_with_the_shims_parent(tmp_path):
    """A Ray node's actor starts its worker's shim with --parent: when the actor dies with its
    node, the worker must not run on (it is being replaced elsewhere)."""
    pid_file = tmp_path / "pid"
    launch = {"argv": ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 600"],
              "env": {"PATH": os.defpath}, "cwd": None, "user": None}
    # The parent starts the shim in a session of its own, as the actor does, waits for the
    # command to be up, then dies.
    parent = subprocess.Popen([PY, "-c", (
        "import json, os, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-I', {SHIM!r}, '--parent', str(os.getpid()), "
        f"{str(tmp_path / 'exit')!r}], stdin=subprocess.PIPE, start_new_session=True)\n"
        f"p.stdin.write(json.dumps({launch!r}).encode()); p.stdin.close()\n"
        f"while not os.path.getsize({str(pid_file)!r}) if os.path.exists({str(pid_file)!r}) "
        "else True: time.sleep(0.02)\n"
        "print(p.pid, flush=True)\n")], stdout=subprocess.PIPE, text=True)
    shim_pid = int(parent.stdout.readline())
    cmd_pid = int(pid_file.read_text())
    assert psutil.pid_exists(cmd_pid)
    parent.wait()
    procs = [p for p in map(_proc, (shim_pid, cmd_pid)) if p]
    gone, alive = psutil.wait_procs(procs, timeout=30)
    assert not alive, f"still running after their parent died: {alive}"


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
