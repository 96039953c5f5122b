"""FL by role: no FL module starts a process. A deployed task's processes are units a runtime
starts; a program's own helpers (the simulation's clients, a server's own leaves, the ADMM
loopback sites) are started by `plinth.runtime.pool`."""

from __future__ import annotations

import ast
from pathlib import Path

import plinth.fl

FL = Path(plinth.fl.__file__).parent
ANY_BASE = {"Process", "ProcessPoolExecutor", "Pool", "Popen", "get_context",
            "set_forkserver_preload"}
BY_BASE = {"subprocess": None,  # any call
           "os": {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnv",
                  "spawnve", "spawnl", "execv", "execve", "execvp"},
           "ray": {"init", "remote"}}


def _starts(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id in ANY_BASE
    if not isinstance(f, ast.Attribute):
        return False
    if f.attr in ANY_BASE:
        return True
    if isinstance(f.value, ast.Name) and f.value.id in BY_BASE:
        names = BY_BASE[f.value.id]
        return names is None or f.attr in names
    return False


def test_no_fl_module_starts_a_process():
    found = []
    for path in sorted(FL.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        found += [f"{path.relative_to(FL)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and _starts(node)]
    assert found == []


def test_the_check_sees_each_way_of_starting_one():
    calls = ["mp.get_context('spawn').Process(target=f)", "ProcessPoolExecutor(2)",
             "subprocess.run(['x'])", "os.fork()", "ray.init()", "ray.remote(C)"]
    for text in calls:
        call = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call))
        assert _starts(call), text
    assert not _starts(ast.parse("os.getpid()").body[0].value)
