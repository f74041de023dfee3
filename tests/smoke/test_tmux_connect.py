"""Runs tests/smoke/tmux_connect.sh: `tinychat serve` in the background and `tinychat --connect`
in a real terminal (tmux), on the default model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("tmux_connect.sh")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def test_tinychat_connect_in_tmux(default_model_dir: Path, tmp_path: Path) -> None:
    tinychat = shutil.which("tinychat") or f"{sys.executable} -m chat_app.cli"
    env = {
        **os.environ,
        "TINYCHAT": tinychat,
        "SERVE_ARGS": f"--model {default_model_dir}",
        "TINYCHAT_HOME": str(tmp_path / "home"),
    }
    result = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "PASS: tmux connect smoke test" in result.stdout
