"""The process the runtime starts for each worker: it runs the command and records how it ended.

    python -I shim.py [--cgroup DIR] [--memory-mib N] [--cpus 0,1] EXIT_FILE -- ARGV...

It joins its limits first (see plinth.runtime.limits), so the command starts inside them. It
relays SIGTERM and SIGINT to the rest of its process group (the command and whatever that
started), each exactly once. When the command ends it writes its exit code to EXIT_FILE
atomically, with a death by signal N written as 128+N as a shell does, and exits with the same
code. The exit file is what lets a restarted control plane learn how a worker it did not start
ended. Only the standard library is imported, so it starts fast and fits small memory limits.
"""

import os
import signal
import subprocess
import sys

RELAYED = (signal.SIGTERM, signal.SIGINT)
_child = None
_pending = 0  # a signal that came before the command started


def _relay(sig, _frame):
    global _pending
    if _child is None:
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


def _run(exit_file, argv, opts):
    global _child
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
    try:
        _child = subprocess.Popen(argv)
    except FileNotFoundError as e:
        print(f"plinth shim: command not found: {e}", file=sys.stderr, flush=True)
        return 127
    except OSError as e:
        print(f"plinth shim: cannot run {argv[0]!r}: {e}", file=sys.stderr, flush=True)
        return 126
    if _pending:
        _relay(_pending, None)
    rc = _child.wait()  # a relayed signal interrupts the wait, which Python then resumes
    return 128 - rc if rc < 0 else rc


def main(args):
    opts = {}
    while args and args[0].startswith("--") and args[0] != "--":
        opts[args[0]] = args[1]
        args = args[2:]
    if len(args) < 3 or args[1] != "--":
        print("usage: shim.py [--cgroup DIR] [--memory-mib N] [--cpus LIST] EXIT_FILE -- ARGV...",
              file=sys.stderr)
        return 2
    exit_file, argv = args[0], args[2:]
    code = _run(exit_file, argv, opts)
    _write_exit(exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
