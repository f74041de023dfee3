"""The app over the engine-core process (the default): the core killed mid-reply, then F5."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from app_doubles import async_test, wait_until
from textual.widgets import Static

from chat_app.app import TinyChatApp
from chat_app.history import HistoryStore
from chat_app.launch import engine_factory
from chat_app.session import ChatSettings

pytestmark = pytest.mark.slow

STORY = ChatSettings(temperature=0.0, repetition_penalty=1.0, max_tokens=400)


@async_test
async def test_the_core_killed_mid_reply_then_restarted(
    default_model_dir: Path, tmp_path: Path
) -> None:
    store = HistoryStore.open(tmp_path / "history.db")
    app = TinyChatApp(lambda: engine_factory(str(default_model_dir), "cpu"), store, defaults=STORY)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the model to load", timeout=120)
        screen = app.chat_screen
        pane = screen.active_pane
        await pane.send("Tell me a long story about a dragon.")
        reply = pane.session.messages[-1]
        await wait_until(pilot, lambda: len(reply.content) > 20, "some of the reply", 120)

        os.kill(app.client.thread.process.pid, signal.SIGKILL)  # the core crashes
        await wait_until(pilot, lambda: not pane.replying, "the reply to end", 30)
        streamed = reply.content
        assert streamed and reply.finish_reason == "error"
        assert "killed" in (reply.error or "")  # the tab says why
        assert app.client.stopped
        screen.refresh_status()
        model_line = screen.query_one("#status-model", Static)
        assert model_line.has_class("error")
        # The history keeps both turns, and what streamed before the crash.
        saved = store.load_session(pane.session.id).messages
        assert [m.role for m in saved] == ["user", "assistant"]
        assert saved[1].content == streamed and saved[1].finish_reason == "error"

        await pilot.press("f5")  # one key restarts the engine
        await wait_until(
            pilot, lambda: app.client.ready and not app.client.stopped, "a new engine", 120
        )
        pane.session.update_settings(ChatSettings(temperature=0.0, max_tokens=24))
        await pane.send("What is the capital of France?")
        await wait_until(pilot, lambda: not pane.replying, "the new reply", 120)
        assert "Paris" in pane.session.messages[-1].content
        assert pane.session.messages[-1].finish_reason in {"stop", "length"}
        core = app.client.thread.process
        await pilot.press("ctrl+q")
    assert core.wait(10) == 0  # Ctrl+Q stopped the core cleanly (SHUTDOWN, not a kill)
    store.close()
