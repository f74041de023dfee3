"""Runs tests/smoke/tmux_smoke.sh: tinychat in a real terminal (tmux), on the default model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("tmux_smoke.sh")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def test_tinychat_in_tmux(default_model_dir: Path, tmp_path: Path) -> None:
    tinychat = shutil.which("tinychat") or f"{sys.executable} -m chat_app.cli"
    env = {
        **os.environ,
        "TINYCHAT": tinychat,
        "TINYCHAT_ARGS": f"--model {default_model_dir}",
        "TINYCHAT_HOME": str(tmp_path / "home"),
        "SMOKE_OUT": str(tmp_path / "captures"),
    }
    result = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "PASS: tmux smoke test" in result.stdout
