"""The engine core dies with its parent: a kill -9 of the app leaves no orphan (cpu, real model).

A parent process starts a core and is killed while the core is still building its engine (the
core is busy then, not waiting on its pipe to the client, so only the death guards can stop it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu.engine_core.lifecycle import PARENT_GONE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PARENT = """
import sys, threading, time
from gpu.engine_core import EngineCoreClient

def start():
    EngineCoreClient(sys.argv[1], "cpu", progress=lambda *_: print("loading", flush=True))

if sys.argv[2] == "thread":  # as the app does: the kernel's death signal is not armed then
    threading.Thread(target=start, daemon=True).start()
    time.sleep(600)
else:
    start()
    time.sleep(600)
"""


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("started_from", ["main", "thread"])
def test_no_orphan_after_the_parent_is_killed(default_model_dir: Path, started_from: str) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(default_model_dir), started_from],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,  # the core's too: it inherits it
        text=True,
        cwd=ROOT,
    )
    cores: list[int] = []
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "loading"
        cores = children_of(parent.pid)
        assert len(cores) == 1 and running(cores[0])
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while running(cores[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(cores[0]), "the core outlived its parent"
        if started_from == "thread":  # the death pipe stopped it, not a failed write later
            assert parent.stderr is not None
            assert PARENT_GONE.decode().strip() in parent.stderr.read()
    finally:
        parent.kill()
        parent.wait(10)
        for pid in cores:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
