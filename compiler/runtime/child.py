"""Processes that own a device (the measuring child, the builders of ``prebuild``): how
they are started, which kernel cache they share, and how they are killed.

Every such process gets the same on-disk kernel cache, one this project names: a kernel a
builder compiled is then found compiled by the measuring child (PoCL's kernel cache;
pycuda and pyopencl keep theirs under the user's cache directory as well).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

CACHE_ENV = "TUNER_KERNEL_CACHE"  # where compiled kernels are kept between processes
POCL_CACHE_ENV = "POCL_CACHE_DIR"


def cache_home() -> Path:
    """The folder this project keeps its caches in: ``$XDG_CACHE_HOME/tuner``, else
    ``~/.cache/tuner`` (the XDG default); one place, so every cache follows XDG alike."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tuner"


def kernel_cache_dir() -> Path:
    """$TUNER_KERNEL_CACHE, else a POCL_CACHE_DIR the user set, else
    ``$XDG_CACHE_HOME/tuner/kernels`` (``~/.cache/tuner/kernels``).

    Once ``opencl._cl`` ran in a process, POCL_CACHE_DIR as it set (or, for a cache it
    could not write, left) it pins that process's PoCL cache for its lifetime (PoCL reads
    it once, as it loads): changing either variable later moves only the children's cache
    (``child_env``), not this process's."""
    for name in (CACHE_ENV, POCL_CACHE_ENV):
        value = os.environ.get(name)
        if value:
            return Path(value).expanduser()
    return cache_home() / "kernels"


def make_writable(cache: Path) -> None:
    """Create ``cache`` and create (and drop) a file in it: OSError when PoCL could not
    save kernels there, e.g. a folder that exists but is not writable (mkdir alone
    accepts that one)."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=cache):
        pass


def child_env() -> dict[str, str]:
    """The environment of a device-owning child: this interpreter's import path and the
    shared kernel cache (PoCL reads POCL_CACHE_DIR once, when it loads)."""
    cache = kernel_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                **{POCL_CACHE_ENV: str(cache)})


def spawn_child(module: str, hello: Any) -> tuple[subprocess.Popen[bytes], Connection]:
    """Start ``python -m module FD`` as the leader of its own process group and send it
    ``hello``; returns the process and its end of the pipe.

    A fresh interpreter, not multiprocessing: no re-import of the caller's __main__ and no
    device state inherited through fork. Leading its own group lets :func:`kill_group`
    take a compiler it runs (pycuda runs nvcc as a process) down with it.
    """
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen([sys.executable, "-m", module, str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], env=child_env(), process_group=0)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    try:
        conn.send(hello)
    except OSError:  # died at once: the caller learns it from the pipe's end
        pass
    return proc, conn


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a child started by :func:`spawn_child` and everything in its group (the group
    outlives its leader, so this runs even when the child has exited), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # gone (or its id reused)
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:  # unkillable (D state): not waited for forever
        pass


def child_connection() -> Connection:
    """In the child: the pipe to the parent (its descriptor is the one argument); SIGINT
    is ignored, so the parent alone decides what Ctrl-C does to the work in hand."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return Connection(int(sys.argv[1]))
