"""Run a model's code and its tests in a subprocess with a time limit and no network or file access.

The child is an isolated interpreter (`python -I`, an empty environment, an empty temporary working directory)
that, before it runs anything it was given, limits its own memory, CPU time, file writes and process count and
takes away what reaches files, processes and the network: `open` and its `io`/`os` twins, os's process, file and
directory calls, and the modules socket, subprocess, multiprocessing, ctypes and their kin. It then runs the
program and the tests in one namespace and tells its verdict by its exit code alone (0: the tests passed, 3: they
raised); any other end (a time-out, a signal, the harness failing) is no verdict. This keeps honest mistakes of a
small model from touching the machine; it is not a boundary against code written to escape it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile

PASSED, FAILED = 0, 3

HARNESS = r"""
import builtins, io, json, os, resource, sys
job = json.loads(sys.stdin.read())
limit = int(job["cpu_s"]) + 1
resource.setrlimit(resource.RLIMIT_CPU, (limit, limit))
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
exit_now = os._exit
def refused(*args, **kwargs):
    raise PermissionError("not allowed in the sandbox")
builtins.open = io.open = os.open = refused
for name in ("system", "popen", "fork", "forkpty", "kill", "killpg", "remove", "unlink", "rmdir", "removedirs",
             "rename", "renames", "replace", "truncate", "chdir", "chmod", "chown", "link", "symlink", "mkdir",
             "makedirs", "listdir", "scandir", "walk", "putenv", "unsetenv", "execv", "execve", "execvp", "execvpe",
             "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp", "_exit", "abort"):
    if hasattr(os, name):
        setattr(os, name, refused)
for name in ("socket", "_socket", "ssl", "subprocess", "multiprocessing", "ctypes", "_ctypes", "shutil", "pty",
             "urllib", "http", "ftplib", "smtplib", "asyncio", "selectors", "signal", "tempfile", "glob"):
    sys.modules[name] = None
scope = {"__name__": "__sandbox__"}
try:
    exec(compile(job["program"], "<answer>", "exec"), scope)
    exec(compile(job["tests"], "<tests>", "exec"), scope)
except BaseException:
    exit_now(3)
exit_now(0)
"""


class SandboxError(Exception):
    """The sandboxed run gave no verdict: it timed out, was killed, or the harness failed."""


def run_python(program: str, tests: str, timeout_s: float = 5.0) -> bool:
    """Run `program` then `tests` (Python source) in the sandbox -> whether the tests passed; SandboxError when
    the run gives no verdict (module docstring)."""
    job = json.dumps({"program": program, "tests": tests, "cpu_s": timeout_s})
    with tempfile.TemporaryDirectory(prefix="specdraft-sandbox-") as workdir:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", HARNESS], input=job, text=True, cwd=workdir,
                                  env={}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SandboxError(f"the sandboxed tests ran past {timeout_s:g} s") from None
    if done.returncode not in (PASSED, FAILED):
        raise SandboxError(f"the sandboxed run ended with exit code {done.returncode}, no verdict")
    return done.returncode == PASSED
