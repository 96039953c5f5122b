"""The process the runtime starts for each worker: it runs the command and records how it ended.

    python -I shim.py [--cgroup DIR] [--memory-mib N] [--cpus 0,1] [--log-limit BYTES]
                      [--parent PID] EXIT_FILE

What to run comes on stdin, as one JSON object the runtime writes and closes:
``{"argv": [...], "env": {...}, "cwd": DIR or null, "user": [UID, GID, [GROUPS]] or null}``.
Nothing of it is in the shim's own argv (so `ps` shows no tenant's command line under a root
process) or in its environment (so nothing a spec names, LD_PRELOAD say, is ever loaded into a
process that keeps root): the shim applies the spec's environment only to the `execve` of the
command, in a child that has already dropped to `user` and made `cwd` its folder as that user.

The shim joins its limits first (see plinth.runtime.limits), so the command starts inside them.
It relays SIGTERM and SIGINT to the rest of its process group (the command and whatever that
started), each exactly once. The command's stdout and stderr come back through a pipe, which the
shim appends to its own stdout (the job's log) until the log holds `--log-limit` bytes; then it
writes one line saying the log was cut and drops the rest. When the command ends it writes its
exit code to EXIT_FILE atomically, with a death by signal N written as 128+N as a shell does, and
exits with the same code. A command that cannot start (no such executable, a workdir the user
cannot enter) ends with 127 or 126 and one line in the log. Only the standard library is
imported, so it starts fast and fits small memory limits.

With `--parent PID` the shim lives only as long as that process: when it is no longer the
shim's parent (it died: a Ray worker node's actor, gone with its node), the shim kills its whole
process group, itself included, within a poll (0.1 s). A worker whose node was declared dead and
replaced elsewhere must not run on beside its replacement.
"""

import json
import os
import select
import signal
import sys

RELAYED = (signal.SIGTERM, signal.SIGINT)
CUT = "\n[plinth] log cut at {} bytes (the log limit); the rest of this attempt's output is dropped\n"
DRAIN_BYTES = 1 << 20  # read after the command ended, from what it left running
_child = 0
_pending = 0  # a signal that came before the command started


def _relay(sig, _frame):
    global _pending
    if not _child:
        _pending = sig
        return
    # Ignore it ourselves while signalling the whole group, so that the command, its children and
    # this shim each get it once (the runtime signals only this shim).
    signal.signal(sig, signal.SIG_IGN)
    try:
        os.killpg(os.getpgrp(), sig)
    finally:
        signal.signal(sig, _relay)


def _limit(opts):
    if "--cgroup" in opts:
        with open(os.path.join(opts["--cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if "--memory-mib" in opts:
        import resource  # only when needed; see limits.py for why RLIMIT_DATA

        n = int(opts["--memory-mib"]) * 2**20
        resource.setrlimit(resource.RLIMIT_DATA, (n, n))
    if "--cpus" in opts:
        os.sched_setaffinity(0, {int(c) for c in opts["--cpus"].split(",")})


def _write_exit(path, code):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{code}\n")
    os.replace(tmp, path)


def _exec(launch, out, search):
    """In the child: drop to the launch's user, enter its folder, run its command (the first
    of the paths in `search` that runs). Never returns; 127 (no such command) or 126
    (anything else) with one line on stderr. Nothing here imports a module: after the drop,
    the interpreter's own library may be out of the user's reach."""
    field = "start"
    try:
        for sig in RELAYED:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        if launch.get("user"):
            field = "run_as"
            uid, gid, groups = launch["user"]
            os.setgroups(groups)
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        if launch.get("cwd"):
            field = "workdir"
            os.chdir(launch["cwd"])
        field = "command[0]"
        argv, env, err = launch["argv"], launch["env"], None
        for path in search:  # as execvp does; os.execvpe would import a module, as the user
            try:
                os.execve(path, argv, env)
            except (FileNotFoundError, NotADirectoryError):
                pass
            except PermissionError as e:
                err = e
        raise err or FileNotFoundError(2, "not found" + ("" if "/" in argv[0] else " on PATH"),
                                       argv[0])
    except BaseException as e:  # noqa: BLE001 -- the child must never return into the shim
        try:
            os.write(2, f"plinth shim: {field}: cannot start: {e}\n".encode())
        finally:
            os._exit(127 if field == "command[0]" and isinstance(e, FileNotFoundError) else 126)


class _Log:
    """Appends the command's output to the log (fd 1) while the log is under `limit` bytes
    (0: no limit); past it, one line that says so, then nothing."""

    def __init__(self, limit):
        self.limit, self.cut = limit, False

    def write(self, data):
        if self.cut:
            return
        try:
            if self.limit:
                room = self.limit - os.fstat(1).st_size
                if len(data) > room:
                    self.cut = True
                    data = data[:max(room, 0)] + CUT.format(self.limit).encode()
            while data:
                data = data[os.write(1, data):]
        except OSError:  # a full disk: the job goes on, its output is lost
            self.cut = True


def _orphaned(parent):
    """End the whole group, this shim too, if `parent` (a pid, or 0 for none) has died."""
    if parent and os.getppid() != parent:
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _pump(r, log, parent):
    """Copy the command's output to the log until the command has ended and its output is
    drained; returns its wait status. Something it left running that holds the pipe open
    does not keep the shim waiting: it is killed with the group when the shim ends."""
    poller = select.poll()
    poller.register(r, select.POLLIN)
    status, drain = None, DRAIN_BYTES
    while drain > 0:
        readable = poller.poll(100 if status is None else 0)
        _orphaned(parent)
        if status is None:  # looked at after every read too: a writer it left may never stop
            pid, st = os.waitpid(_child, os.WNOHANG)
            if pid:
                status = st
        if not readable:
            if status is not None:
                break  # ended, and nothing more to read now
            continue
        data = os.read(r, 1 << 16)
        if not data:  # every writer is gone
            return os.waitpid(_child, 0)[1] if status is None else status
        log.write(data)
        if status is not None:
            drain -= len(data)
    return status


def _run(exit_file, opts, launch):
    global _child
    _orphaned(int(opts.get("--parent", 0)))
    try:
        _limit(opts)
    except (OSError, ValueError) as e:
        print(f"plinth shim: cannot apply limits {opts}: {e}", file=sys.stderr, flush=True)
        return 126
    for sig in RELAYED:
        signal.signal(sig, _relay)
    # The runtime starts us with these blocked, so that none is lost before the handler exists.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)
    if _pending:
        return 128 + _pending  # stopped before it started
    exe = launch["argv"][0]
    search = [exe] if "/" in exe else \
        [os.path.join(d, exe) for d in os.get_exec_path(launch["env"])]
    r, w = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)  # the child resets them before unblocking
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _exec(launch, w, search)
    _child = pid
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)
    os.close(w)
    if _pending:
        _relay(_pending, None)
    status = _pump(r, _Log(int(opts.get("--log-limit", 0))), int(opts.get("--parent", 0)))
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(args):
    opts = {}
    while args and args[0].startswith("--"):
        opts[args[0]] = args[1]
        args = args[2:]
    if len(args) != 1:
        print("usage: shim.py [--cgroup DIR] [--memory-mib N] [--cpus LIST] [--log-limit BYTES] "
              "[--parent PID] EXIT_FILE < LAUNCH_JSON", file=sys.stderr)
        return 2
    try:
        launch = json.loads(sys.stdin.buffer.read())
    except ValueError as e:
        print(f"plinth shim: the launch on stdin is not JSON: {e}", file=sys.stderr, flush=True)
        return 2
    code = _run(args[0], opts, launch)
    _write_exit(args[0], code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
