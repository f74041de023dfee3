"""The engine build's progress where users see it: the CLI's bar on stderr and the app's
loading line."""

from __future__ import annotations

from chat_app.cli import ProgressPrinter
from chat_app.engine_client import EngineClient


def test_the_cli_draws_a_bar_per_kind_of_work(capsys):
    progress = ProgressPrinter()
    progress("loading weights", 0, 0)
    progress("loading kernels", 3, 12)  # same kind of work: the same line, rewritten
    progress("compiling kernels", 6, 24)
    progress("compiling kernels", 24, 24)
    progress.finish()
    lines = capsys.readouterr().err.split("\n")
    assert lines[0].startswith("\rloading weights...")
    assert lines[0].endswith("\rloading kernels [######------------------] 3/12 (25%)")
    assert lines[1].endswith("[########################] 24/24 (100%)")
    assert "compiling kernels [######------------------] 6/24 (25%)" in lines[1]
    assert lines[2] == ""


def test_the_apps_loading_line_follows_the_build():
    client = EngineClient(bridge=None)  # type: ignore[arg-type]
    assert client.describe() == "loading model…"
    client.report_progress("compiling kernels", 12, 60)
    assert client.describe() == "loading model… compiling kernels 12/60"
    client.report_progress("warming up", 0, 0)
    assert client.describe() == "loading model… warming up"
    client.fail("boom")
    assert client.describe() == "model failed to load"
