"""A `d3s train` run as the child process of `d3s compare`: waited for through a Ctrl-C, stopped when its parent dies.

- The child runs in its parent's process group, so a Ctrl-C at the terminal reaches both: the run stops, saves
  its last finished step and says so, and the parent waits for it (`run_child`), then stops too. The parent
  sends it nothing of its own: a second SIGINT would cut the run's save short. (`subprocess.run` kills a child
  0.25 s after a Ctrl-C, which did exactly that.) A SIGINT sent to the parent alone lets the run finish.
- The child stops when its parent dies, also by SIGKILL, which no handler of the parent sees
  (`stop_with_parent`, called by the child when `PARENT_ENV` names its parent): on Linux the kernel sends it
  SIGTERM (`prctl(PR_SET_PDEATHSIG)`), which stops a run the way Ctrl-C does; elsewhere a thread watches the
  parent and sends it. A parent that died before the child asked is noticed at once.
- A Ctrl-C while the child is still loading (importing torch) ends it quietly (`CHILD_MAIN`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

PARENT_ENV = "D3S_PARENT_PID"
"""Set by `run_child` in the child's environment: the pid of the process whose death stops the child."""

_PR_SET_PDEATHSIG = 1  # linux/prctl.h

CHILD_MAIN = (
    "import os, signal\n"
    "signal.signal(signal.SIGINT, lambda *_: os._exit(130))\n"  # a Ctrl-C while d3s loads: stop at once
    "from d3s.app.cli import run\n"
    "try:\n"
    "    import d3s.integrations.trl\n"  # torch, transformers, accelerate, TRL
    "except Exception:\n"
    "    pass\n"  # `run` imports it again and says what is wrong
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "run()\n"
)
"""The child's program (`python -c CHILD_MAIN train ...`): `d3s` as `python -m d3s.cli` runs it, except that a
Ctrl-C while it imports torch, transformers and TRL ends it at once (exit 130), with no import traceback. The
imports happen before `run` so that no `KeyboardInterrupt` is raised inside them: one raised there can leave a
module half-imported without reaching `run` (seen: accelerate's import then recursed on numpy's `np.dtypes` without
end and the run ended with a traceback). Nothing is written while the child imports: nothing to save or clean up."""


def run_child(cmd: Sequence[str], env: dict[str, str]) -> int:
    """Run `cmd` with `env` and return its exit status. A Ctrl-C meanwhile reached the child too (one process
    group): the child stops in its own way, this waits for it to end, then raises `KeyboardInterrupt`."""
    child = subprocess.Popen(list(cmd), env={**env, PARENT_ENV: str(os.getpid())})
    interrupted = False
    while True:
        try:
            code = child.wait()
            break
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt
    return code


def stop_with_parent() -> None:
    """In a child started by `run_child`: get SIGTERM when the parent dies. Nothing for other processes."""
    try:
        parent = int(os.environ.get(PARENT_ENV, ""))
    except ValueError:
        return
    if not _kernel_signals_parent_death():
        threading.Thread(target=_watch_parent, args=(parent,), name="d3s-parent-watch", daemon=True).start()
    if os.getppid() != parent:  # it died before the request: this process was handed to another parent
        os.kill(os.getpid(), signal.SIGTERM)


def _kernel_signals_parent_death() -> bool:
    """Ask Linux for SIGTERM when the parent dies; False where it cannot be asked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
