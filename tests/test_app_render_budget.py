"""The app's render budget: what a streaming reply costs the UI (headless, fake engine).

Each test counts work instead of timing it: Markdown appends per tab (at most ~30 a second,
however fast tokens come), appends on a hidden tab (none until it is shown), and the source
each append parses (bounded by the last block, not the reply's length).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from textual.app import App, ComposeResult
from textual.widgets import Markdown

from chat_app.bridge import DEFAULT_FPS
from chat_app.session import ChatMessage
from chat_app.testing import FakeEngine, async_test, fake_app, open_tab, paste_text, wait_until
from chat_app.widgets.messages import AssistantReply


@pytest.fixture
def appends(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[float]]:
    """Every Markdown.append, by widget (id) -> the times it was called."""
    calls: dict[int, list[float]] = defaultdict(list)
    original = Markdown.append

    def counted(self: Markdown, markdown: str):
        calls[id(self)].append(time.monotonic())
        return original(self, markdown)

    monkeypatch.setattr(Markdown, "append", counted)
    return calls


def _markdown_of(pane) -> Markdown:
    return pane.query_one(AssistantReply).markdown


async def _send(pilot, text: str) -> None:
    await paste_text(pilot, text)
    await pilot.press("enter")


@async_test
async def test_a_fast_stream_renders_at_most_about_30_times_a_second(
    tmp_path: Path, appends: dict[int, list[float]]
) -> None:
    words = 1500
    engine = FakeEngine(reply=lambda _: " ".join(["tok"] * words))
    app, _ = fake_app(tmp_path, engine, step_delay=0.0005)
    async with app.run_test(size=(100, 32)) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        pane = app.chat_screen.active_pane
        await _send(pilot, "go")
        await wait_until(pilot, lambda: not pane.replying, "the reply", timeout=30)
        await pilot.pause(0.1)
        markdown = _markdown_of(pane)
        times = appends[id(markdown)]
        assert markdown.source == pane.session.messages[-1].content  # nothing lost
        elapsed = times[-1] - times[0]
        assert len(times) <= DEFAULT_FPS * elapsed + 3, (len(times), elapsed)
        assert words >= 5 * len(times)  # the tokens really were coalesced


@async_test
async def test_a_hidden_tab_renders_nothing_and_catches_up_when_shown(
    tmp_path: Path, appends: dict[int, list[float]]
) -> None:
    engine = FakeEngine(
        reply=lambda _: "\n\n".join(f"Paragraph {n} of the reply." for n in range(40))
    )
    app, thread = fake_app(tmp_path, engine, manual=True)
    async with app.run_test(size=(100, 32)) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        first = app.chat_screen.active_pane
        await _send(pilot, "go")
        thread.allow_steps(20)
        await wait_until(pilot, lambda: _markdown_of(first).source, "the first tokens shown")
        await open_tab(pilot)  # the first tab goes to the background, still streaming
        await pilot.pause(0.1)
        markdown = _markdown_of(first)
        rendered = len(appends[id(markdown)])
        shown_source = markdown.source
        thread.allow_steps(1000)
        await wait_until(pilot, lambda: not first.replying, "the end of the reply")
        await pilot.pause(0.2)
        assert len(appends[id(markdown)]) == rendered  # not one render while hidden
        assert markdown.source == shown_source
        final = first.session.messages[-1].content
        assert final.endswith("Paragraph 39 of the reply.")
        await pilot.press("alt+1")
        await wait_until(pilot, lambda: markdown.source == final, "the hidden tab caught up")
        assert len(appends[id(markdown)]) == rendered + 1  # in one append


class _ReplyApp(App[None]):
    def __init__(self, message: ChatMessage) -> None:
        super().__init__()
        self.message = message

    def compose(self) -> ComposeResult:
        yield AssistantReply(self.message)


@async_test
async def test_a_long_reply_parses_only_its_last_block_per_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10,000 tokens streamed as ~300 updates (1,000 tok/s at 30 frames a second): every update
    parses what is new plus the block it continues, never the whole reply."""
    parsed: list[int] = []
    original = MarkdownIt.parse

    def counted(self: MarkdownIt, src: str, env=None):
        parsed.append(len(src))
        return original(self, src, env)

    monkeypatch.setattr(MarkdownIt, "parse", counted)
    paragraph = " ".join(f"w{n}" for n in range(60)) + "\n\n"  # 60 tokens a paragraph
    tokens = [piece + " " for _ in range(10_000 // 60 + 1) for piece in paragraph.split(" ")]
    tokens = tokens[:10_000]
    chunk = 33
    message = ChatMessage("assistant", "")
    app = _ReplyApp(message)
    async with app.run_test(size=(100, 32)) as pilot:
        reply = app.query_one(AssistantReply)
        for start in range(0, len(tokens), chunk):
            text = "".join(tokens[start : start + chunk])
            message.content += text
            await reply.append(text)
            while len(reply.markdown.source) < len(message.content):  # one append per update
                await asyncio.sleep(0)
        await reply.finish("length")
        await pilot.pause()
        assert reply.markdown.source == message.content
    longest = len(paragraph) + chunk * 8  # the block it continues, and one update's text
    assert max(parsed) <= 2 * longest, max(parsed)
    assert sum(parsed) <= 4 * len(message.content)  # linear in the reply, not quadratic
    assert len(parsed) >= 100  # it did stream, update by update
