"""The app on the real default model (SmolLM2-135M-Instruct), cpu backend, a few tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from app_doubles import async_test, open_tab, paste_text, wait_until

from chat_app.app import TinyChatApp
from chat_app.history import HistoryStore
from chat_app.launch import engine_factory
from chat_app.session import ChatSettings

pytestmark = pytest.mark.slow

GREEDY = ChatSettings(temperature=0.0, repetition_penalty=1.0, max_tokens=24)


def answered(pane, n: int) -> bool:
    return not pane.replying and sum(m.role == "assistant" for m in pane.session.messages) == n


@async_test
async def test_two_tabs_at_once_then_a_follow_up_on_the_real_engine(
    default_model_dir: Path, tmp_path: Path
) -> None:
    store = HistoryStore.open(tmp_path / "history.db")
    app = TinyChatApp(lambda: engine_factory(str(default_model_dir), "cpu"), store, defaults=GREEDY)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the model to load", timeout=120)
        assert app.client.describe().startswith("SmolLM2-135M-Instruct · cpu · KV ")
        screen = app.chat_screen
        story = ChatSettings(temperature=0.0, repetition_penalty=1.0, max_tokens=64)
        screen.active_pane.session.update_settings(story)
        await open_tab(pilot)
        await pilot.press("alt+1")
        await wait_until(pilot, lambda: screen.active_pane is screen.panes[0], "tab 1")
        await paste_text(pilot, "Tell me a story about a dragon.")
        await pilot.press("enter")
        # Tab 2's question goes out at once (Pilot's key presses wait for the screen to
        # settle, which takes a while mid-stream), so both replies share the engine.
        await screen.panes[1].send("What is the capital of France?")
        first, second = screen.panes
        await wait_until(
            pilot, lambda: answered(first, 1) and answered(second, 1), "both replies", 180
        )
        paris = second.session.messages[-1]
        assert "Paris" in paris.content
        assert paris.finish_reason in {"stop", "length"}
        assert "dragon" in first.session.messages[-1].content.lower()
        # They ran side by side in the engine's batch, not one after the other.
        one, two = first.last_metrics, second.last_metrics
        assert one is not None and two is not None
        assert two.first_token_time < one.finished_time

        # A follow-up prefills only what is new: the first turn comes from the prefix cache.
        await pilot.press("alt+2")
        await wait_until(pilot, lambda: screen.active_pane is second, "tab 2")
        await paste_text(pilot, "And of Italy?")
        await pilot.press("enter")
        await wait_until(pilot, lambda: answered(second, 2), "the follow-up", 120)
        assert second.last_metrics is not None and second.last_metrics.num_cached_tokens > 0
        stats = app.client.stats()
        assert stats is not None and stats.prefix_cache_hits > 0
        await pilot.press("ctrl+q")
    store.close()
