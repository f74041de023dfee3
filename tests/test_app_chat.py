"""The chat tabs, headless (run_test + Pilot) on the deterministic fake engine.

Every test drives the app with keys, as a user would, and checks both what the tab shows and
what the session (and so the history) holds.
"""

from __future__ import annotations

import threading
from pathlib import Path

from app_doubles import (
    FakeEngine,
    FakeEngineThread,
    async_test,
    fake_app,
    open_tab,
    paste_text,
    type_text,
    wait_until,
)

from chat_app.session import ChatSettings
from chat_app.widgets.chat_pane import ChatPane
from chat_app.widgets.messages import AssistantReply, Notice, UserMessage

SIZE = (100, 32)


def replies(pane: ChatPane) -> list[str]:
    return [m.content for m in pane.session.messages if m.role == "assistant"]


def status_text(app, widget_id: str) -> str:
    return str(app.chat_screen.query_one(f"#{widget_id}").render())


async def send(pilot, text: str) -> None:
    """Paste the text (typing key by key costs ~70 ms a key) and press Enter."""
    await paste_text(pilot, text)
    await pilot.press("enter")


async def ready(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.client.ready, "the engine")


def done(pane: ChatPane) -> bool:
    return not pane.replying


@async_test
async def test_enter_sends_and_the_reply_streams_into_the_tab(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        assert pane.input.has_focus
        await type_text(pilot, "hello engine")  # key by key, once
        await pilot.press("enter")
        await wait_until(pilot, lambda: done(pane) and replies(pane), "the reply")
        assert pane.input.text == ""
        assert replies(pane) == [
            "You said: **hello engine**. Every word of this reply is one token"
        ]
        assert [w.message.content for w in pane.query(UserMessage)] == ["hello engine"]
        reply = pane.query_one(AssistantReply)
        assert reply.message.finish_reason == "stop"
        # The Markdown widget holds the streamed text.
        assert "hello engine" in str(reply.query_one("Markdown").source)


@async_test
async def test_start_up_is_usable_while_the_model_loads(tmp_path: Path) -> None:
    gate = threading.Event()
    thread = FakeEngineThread(FakeEngine())

    def slow_factory() -> FakeEngineThread:
        gate.wait(10)
        return thread

    app, _ = fake_app(tmp_path)
    app._engine_factory = slow_factory
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert status_text(app, "status-model") == "loading model…"
        pane = app.chat_screen.active_pane
        await send(pilot, "early question")
        assert [m.content for m in pane.session.messages] == ["early question"]
        assert any("still loading" in str(n.render()) for n in pane.query(Notice))
        gate.set()
        await ready(pilot)
        assert status_text(app, "status-model") == "fake-echo · cpu · KV 8,192 tok"
        await wait_until(pilot, lambda: done(pane) and replies(pane), "the queued reply")
        assert "early question" in replies(pane)[0]


@async_test
async def test_several_tabs_sending_at_once_each_get_their_own_reply(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, FakeEngine(reply_words=20), manual=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        questions = ["apples", "bananas", "cherries"]
        for i, question in enumerate(questions):
            if i:
                await open_tab(pilot)
            await send(pilot, question)
        screen = app.chat_screen
        panes = screen.panes
        assert len(panes) == 3 and all(p.replying for p in panes)
        engine.allow_steps(2)
        await wait_until(pilot, lambda: engine.stats().num_running == 3, "a batch of three")
        engine.allow_steps(100)
        await wait_until(pilot, lambda: all(done(p) for p in panes), "three replies")
        for pane, question in zip(panes, questions, strict=True):
            (reply,) = replies(pane)
            assert reply.startswith(f"You said: **{question}**.")
            assert all(other not in reply for other in questions if other != question)


@async_test
async def test_escape_stops_the_reply_and_keeps_what_streamed(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, FakeEngine(reply_words=30), manual=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        await send(pilot, "tell me everything")
        engine.allow_steps(3)
        await wait_until(pilot, lambda: len(replies(pane)[0].split()) == 3, "three tokens")
        assert "stop_reply" in {b.binding.id for b in app.screen.active_bindings.values()}
        await pilot.press("escape")
        assert not pane.replying
        streamed = replies(pane)[0]
        assert streamed == "You said: **tell"
        engine.allow_steps(5)
        await wait_until(pilot, lambda: engine.stats().num_running == 0, "the abort")
        await pilot.pause(0.1)
        assert replies(pane) == [streamed]  # nothing more arrived after Escape
        last = pane.session.messages[-1]
        assert last.finish_reason == "abort"
        ending = pane.query_one(AssistantReply).query_one(".ending")
        assert "stopped" in str(ending.render())
        # With nothing to stop, Escape is not offered (and falls through to the widgets).
        assert "stop_reply" not in {b.binding.id for b in app.screen.active_bindings.values()}
        await pilot.press("escape")
        assert replies(pane) == [streamed]


@async_test
async def test_reset_clears_and_undo_brings_back(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        await send(pilot, "first")
        await wait_until(pilot, lambda: done(pane) and replies(pane), "the reply")
        before = [(m.role, m.content) for m in pane.session.messages]
        await pilot.press("ctrl+r")
        assert pane.session.messages == []
        assert not pane.query(UserMessage) and not pane.query(AssistantReply)
        assert pane.query_one(".welcome").display
        await pilot.press("ctrl+z")
        assert [(m.role, m.content) for m in pane.session.messages] == before
        assert len(pane.query(UserMessage)) == 1 and len(pane.query(AssistantReply)) == 1
        # A reset followed by a new message is final: Ctrl+Z is the TextArea's undo again.
        await pilot.press("ctrl+r")
        await send(pilot, "second")
        await wait_until(pilot, lambda: done(pane) and replies(pane), "the reply")
        await pilot.press("ctrl+z")
        assert [m.content for m in pane.session.messages if m.role == "user"] == ["second"]


@async_test
async def test_reset_stops_the_reply_and_releases_its_kv_blocks(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, FakeEngine(reply_words=30), manual=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        await send(pilot, "a question long enough to fill a couple of KV blocks " * 3)
        engine.allow_steps(2)
        await wait_until(pilot, lambda: engine.stats().kv_blocks_used > 0, "blocks in use")
        await pilot.press("ctrl+r")
        engine.allow_steps(1)
        await wait_until(pilot, lambda: engine.stats().num_running == 0, "the abort")
        stats = engine.stats()
        assert (stats.kv_blocks_used, stats.num_waiting) == (0, 0)
        assert pane.session.messages == []


@async_test
async def test_ctrl_g_regenerates_the_last_reply(tmp_path: Path) -> None:
    counter = iter(range(1, 100))
    app, engine = fake_app(tmp_path, FakeEngine(reply=lambda prompt: f"answer {next(counter)}"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        await send(pilot, "q")
        await wait_until(pilot, lambda: done(pane) and replies(pane) == ["answer 1"], "answer 1")
        await pilot.press("ctrl+g")
        await wait_until(pilot, lambda: done(pane) and replies(pane) == ["answer 2"], "answer 2")
        assert [m.role for m in pane.session.messages] == ["user", "assistant"]
        assert len(pane.query(AssistantReply)) == 1
        # The regenerated request carried the same conversation.
        assert engine.engine.requests[0][1] == engine.engine.requests[1][1]


@async_test
async def test_a_prompt_longer_than_the_context_is_refused_in_the_tab(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path, FakeEngine(max_model_len=120))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        long_text = "word " * 40
        await send(pilot, long_text)
        (notice,) = pane.query(Notice)
        assert "longer than the model's context of 120 tokens" in str(notice.render())
        assert notice.has_class("error")
        assert pane.session.messages == [] and not pane.query(UserMessage)
        assert pane.input.text == long_text.strip()  # handed back for editing
        assert app.store.list_sessions() == []  # no empty chat left in the history
        tab = app.chat_screen.tabs.get_tab(pane)
        await wait_until(pilot, lambda: str(tab.label) == "1 New chat", "the title reset")
        pane.input.clear()
        await send(pilot, "short")
        await wait_until(pilot, lambda: done(pane) and replies(pane), "a reply to a short one")


@async_test
async def test_an_engine_error_shows_in_its_tab_while_other_tabs_go_on(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, FakeEngine(reply_words=12), manual=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "[fail] this one")
        await open_tab(pilot)
        await send(pilot, "this one works")
        first, second = app.chat_screen.panes
        engine.allow_steps(100)
        await wait_until(pilot, lambda: done(first) and done(second), "both replies")
        assert first.session.messages[-1].finish_reason == "error"
        assert first.session.messages[-1].error == "fake engine failure (as asked)"
        ending = first.query_one(AssistantReply).query_one(".ending")
        assert "fake engine failure" in str(ending.render()) and ending.has_class("error")
        assert second.session.messages[-1].finish_reason == "stop"
        assert replies(second)[0].endswith("stream theirs.") is False  # 12 words, not all
        assert "this one works" in replies(second)[0]


@async_test
async def test_a_model_that_fails_to_load_is_reported_and_history_stays(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:  # a first run leaves a chat behind
        await ready(pilot)
        await send(pilot, "remember me")
        pane = app.chat_screen.active_pane
        await wait_until(pilot, lambda: done(pane) and replies(pane), "the reply")
        await pilot.press("ctrl+q")

    def broken() -> FakeEngineThread:
        raise RuntimeError("no weights in /nowhere")

    app, _ = fake_app(tmp_path)
    app._engine_factory = broken
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.load_error is not None, "the failure")
        await pilot.pause()
        assert status_text(app, "status-model") == "model failed to load"
        pane = app.chat_screen.active_pane
        assert [m.content for m in pane.session.messages][0] == "remember me"
        assert any("no weights in /nowhere" in str(n.render()) for n in pane.query(Notice))
        await send(pilot, "still there?")
        assert any("Cannot send" in str(n.render()) for n in pane.query(Notice))
        assert pane.input.text == "still there?"


@async_test
async def test_newlines_with_ctrl_j_and_shift_enter_and_up_recalls(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        await type_text(pilot, "line one")
        await pilot.press("ctrl+j")
        await type_text(pilot, "line two")
        await pilot.press("shift+enter")
        await type_text(pilot, "three")
        assert pane.input.text == "line one\nline two\nthree"
        await pilot.press("enter")
        await wait_until(pilot, lambda: done(pane) and replies(pane), "the reply")
        assert pane.session.messages[0].content == "line one\nline two\nthree"
        await send(pilot, "second message")
        await wait_until(pilot, lambda: done(pane) and len(replies(pane)) == 2, "reply two")
        await pilot.press("up")
        assert pane.input.text == "second message"
        await pilot.press("up")
        assert pane.input.text == "line one\nline two\nthree"
        # In a box with text, Up moves the cursor as usual.
        assert pane.input.cursor_location == (2, 5)
        await pilot.press("up")
        assert pane.input.cursor_location[0] == 1
        assert pane.input.text == "line one\nline two\nthree"


@async_test
async def test_a_busy_background_tab_is_marked_in_its_title(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, FakeEngine(reply_words=10), manual=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "background work")
        first = app.chat_screen.active_pane
        tabs = app.chat_screen.tabs

        def label() -> str:
            return str(tabs.get_tab(first).label)

        await wait_until(pilot, lambda: label() == "1 background work", "its title (shown)")
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: label() == "● 1 background work", "the busy marker")
        engine.allow_steps(100)
        await wait_until(pilot, lambda: done(first), "the background reply")
        await wait_until(pilot, lambda: label() == "1 background work", "the marker to go")
        assert replies(first) and "background work" in replies(first)[0]


@async_test
async def test_the_view_follows_the_stream_unless_the_user_scrolled_up(tmp_path: Path) -> None:
    app, engine = fake_app(
        tmp_path, FakeEngine(reply=lambda p: " ".join(["word"] * 400)), manual=True
    )
    async with app.run_test(size=(60, 20)) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        log = pane.log_view
        await send(pilot, "long")
        engine.allow_steps(150)
        await wait_until(pilot, lambda: len(replies(pane)[0].split()) >= 150, "150 tokens")
        await pilot.pause(0.2)
        assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y
        await pilot.press("pageup")  # the user scrolls up to read
        await pilot.pause(0.2)
        where = log.scroll_y
        assert where < log.max_scroll_y
        engine.allow_steps(150)
        await wait_until(pilot, lambda: len(replies(pane)[0].split()) >= 300, "300 tokens")
        await pilot.pause(0.2)
        assert log.scroll_y == where  # left where the user put it
        while log.scroll_y < log.max_scroll_y:  # back down to the bottom: pinned again
            await pilot.press("pagedown")
            await pilot.pause(0.05)
        engine.allow_steps(100)
        await wait_until(pilot, lambda: not pane.replying, "the end of the reply")
        await pilot.pause(0.2)
        assert log.scroll_y == log.max_scroll_y


@async_test
async def test_settings_apply_to_the_next_message(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, defaults=ChatSettings(temperature=0.5))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        await send(pilot, "one")
        await wait_until(pilot, lambda: done(pane) and replies(pane), "reply one")
        assert engine.engine.requests[-1][2].temperature == 0.5
        pane.session.update_settings(ChatSettings(temperature=0.0, system_prompt="Be terse."))
        await send(pilot, "two")
        await wait_until(pilot, lambda: done(pane) and len(replies(pane)) == 2, "reply two")
        _, prompt, params = engine.engine.requests[-1]
        assert params.temperature == 0.0
        assert prompt.startswith("<|im_start|>system\nBe terse.<|im_end|>")
        assert "one" in prompt and replies(pane)[0] in prompt


@async_test
async def test_a_follow_up_sends_the_whole_chat_and_reuses_the_cached_prefix(
    tmp_path: Path,
) -> None:
    app, engine = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        await send(pilot, "What is a paged KV cache?")
        await wait_until(pilot, lambda: done(pane) and replies(pane), "reply one")
        await send(pilot, "And prefix caching?")
        await wait_until(pilot, lambda: done(pane) and len(replies(pane)) == 2, "reply two")
        first, second = (prompt for _, prompt, _ in engine.engine.requests)
        assert second.startswith(first + replies(pane)[0])
        # The engine found the first turn's blocks: only the new message was prefilled.
        assert pane.last_metrics is not None
        cached = pane.last_metrics.num_cached_tokens
        assert len(first) - 16 < cached <= len(first) + len(replies(pane)[0])
