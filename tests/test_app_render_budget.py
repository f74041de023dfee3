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
from app_doubles import FakeEngine, async_test, fake_app, open_tab, paste_text, wait_until
from markdown_it import MarkdownIt
from textual.app import App, ComposeResult
from textual.widgets import Markdown

from chat_app.bridge import DEFAULT_FPS
from chat_app.session import ChatMessage
from chat_app.widgets.messages import LAST_BLOCK, PART_CHARS, AssistantReply, part_break


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


def _reply_of(pane) -> AssistantReply:
    return pane.query_one(AssistantReply)


def _renders(reply: AssistantReply, appends: dict[int, list[float]]) -> list[float]:
    return sorted(t for part in reply.parts for t in appends[id(part)])


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
        reply = _reply_of(pane)
        times = _renders(reply, appends)
        assert reply.source == pane.session.messages[-1].content  # nothing lost
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
        await wait_until(pilot, lambda: _reply_of(first).source, "the first tokens shown")
        await open_tab(pilot)  # the first tab goes to the background, still streaming
        await pilot.pause(0.1)
        reply = _reply_of(first)
        rendered = len(_renders(reply, appends))
        shown_source = reply.source
        thread.allow_steps(1000)
        await wait_until(pilot, lambda: not first.replying, "the end of the reply")
        await pilot.pause(0.2)
        assert len(_renders(reply, appends)) == rendered  # not one render while hidden
        assert reply.source == shown_source
        final = first.session.messages[-1].content
        assert final.endswith("Paragraph 39 of the reply.")
        await pilot.press("alt+1")
        await wait_until(pilot, lambda: reply.source == final, "the hidden tab caught up")
        assert len(_renders(reply, appends)) == rendered + 1  # in one append
        # Each part's last block, and it alone, loses its bottom margin; and no style rule
        # depends on order, which would restyle every sibling of each widget mounted.
        await pilot.pause(0.1)
        for part in reply.parts:
            assert [b for b in part.children if b.has_class(LAST_BLOCK)] == [part.children[-1]]
            assert part.children[-1].styles.margin.bottom == 0
            assert part.children[0].styles.margin.bottom == 1
        assert not any(node._has_order_style for node in app.screen.walk_children())


class _ReplyApp(App[None]):
    def __init__(self, message: ChatMessage) -> None:
        super().__init__()
        self.message = message

    def compose(self) -> ComposeResult:
        yield AssistantReply(self.message)


@async_test
async def test_a_long_reply_parses_and_lays_out_only_its_end_per_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10,000 tokens streamed as ~300 updates (1,000 tok/s at 30 frames a second): every update
    parses what is new plus the block it continues, never the whole reply, and lands in a
    part of a few blocks (the part Textual lays out again), never in one of the whole reply."""
    parsed: list[int] = []
    original = MarkdownIt.parse

    def counted(self: MarkdownIt, src: str, env=None):
        parsed.append(len(src))
        return original(self, src, env)

    monkeypatch.setattr(MarkdownIt, "parse", counted)
    words = [f"w{n} " for n in range(59)] + ["w59\n\n"]  # a paragraph of 60 tokens
    paragraph = "".join(words)
    tokens = (words * (10_000 // 60 + 1))[:10_000]
    chunk = 33
    message = ChatMessage("assistant", "")
    app = _ReplyApp(message)
    async with app.run_test(size=(100, 32)) as pilot:
        reply = app.query_one(AssistantReply)
        blocks = []
        for start in range(0, len(tokens), chunk):
            text = "".join(tokens[start : start + chunk])
            message.content += text
            await reply.append(text)
            while len(reply.source) < len(message.content):  # one append per update
                await asyncio.sleep(0)
            blocks.append(len(reply.parts[-1].children))
        await reply.finish("length")
        await pilot.pause()
        assert reply.source == message.content
        assert len(reply.parts) >= len(message.content) // PART_CHARS - 1
    assert max(blocks) <= PART_CHARS // len(paragraph) + 3, max(blocks)
    longest = len(paragraph) + chunk * 8  # the block it continues, and one update's text
    assert max(parsed) <= 2 * longest, max(parsed)
    assert sum(parsed) <= 4 * len(message.content)  # linear in the reply, not quadratic
    assert len(parsed) >= 100  # it did stream, update by update


def test_a_reply_splits_into_parts_only_where_the_markdown_parses_the_same() -> None:
    long = "x" * 2_000 + "\n\n"
    assert part_break("short", "\n\nNext paragraph") is None  # not long enough yet
    assert part_break(long, "end.\n\nNext paragraph") == len("end.\n\n")
    assert part_break(long, "end.\n\n- a list item") is None  # lists, headings, indents...
    assert part_break(long, "end.\n\n# Heading") is None
    assert part_break(long, "end.\n\n    indented") is None
    fenced = "```python\nx = 1\n\n"
    assert part_break(long + fenced, "y = 2\n\nz = 3") is None  # inside a code fence
    closed = "y = 2\n```\n\nAfter the code."
    assert part_break(long + fenced, closed) == closed.index("After")
