"""How a conversation looks: the user's messages, the model's replies, and notices."""

from __future__ import annotations

import re
from collections.abc import Iterable

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import AwaitMount, Widget
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from chat_app.session import ChatMessage

_ENDINGS = {
    "length": "… cut at the token limit (see max tokens in the settings)",
    "abort": "■ stopped",
    "interrupted": "■ interrupted: tinychat closed while this reply streamed",
}


class UserMessage(Static):
    """What the user sent, verbatim (no markup: it is their text, not ours)."""

    def __init__(self, message: ChatMessage) -> None:
        super().__init__(message.content, markup=False)
        self.message = message


class Notice(Static):
    """A line from tinychat itself in the chat: an error, or what just happened."""

    def __init__(self, text: str, *, error: bool = False) -> None:
        super().__init__(text, markup=False, classes="error" if error else "info")


PART_CHARS = 2_000  # a streaming reply starts a new Markdown part past this many characters
_NEW_PARAGRAPH = re.compile(r"\n\n(?=[^\W\d_])")  # a blank line, then a letter at column 0
_FENCE = re.compile(r"^ {0,3}(?:```|~~~)", re.MULTILINE)


def part_break(part: str, new: str, limit: int = PART_CHARS) -> int | None:
    """Where in `new` the Markdown part holding `part` may end and the next one begin (an
    offset into `new`), or None: only once the part is `limit` characters long, and only
    before a paragraph that opens a line after a blank one, outside code fences. There the
    text before and the text after parse as they would together."""
    if len(part) + len(new) < limit:
        return None
    for match in reversed(list(_NEW_PARAGRAPH.finditer(new))):
        if len(_FENCE.findall(part + new[: match.end()])) % 2 == 0:
            return match.end()
    return None


LAST_BLOCK = "last-block"  # the class of a part's last block (tinychat.tcss)


class ReplyPart(Markdown):
    """One Markdown part of a reply, whose last block carries the class LAST_BLOCK (its
    bottom margin goes, so the reply's border ends with its text).

    A class, kept here as blocks mount, rather than a `:last-child` rule: one rule with an
    order pseudo-class made Textual restyle, on every mount, each sibling of the mounted
    widget and all of their descendants, in every widget of the app (the rule's `*` matched
    them all). Each block a stream added restyled every block of its part, and each message
    sent restyled every reply of its tab: a fifth of the UI thread's time, 8 tabs streaming.
    """

    _last: Widget | None = None

    def mount_all(
        self,
        widgets: Iterable[Widget],
        *,
        before: int | str | Widget | None = None,
        after: int | str | Widget | None = None,
    ) -> AwaitMount:
        widgets = list(widgets)
        if widgets and before is None and after is None:  # how Markdown adds blocks
            if self._last is not None and self._last.parent is self:
                self._last.remove_class(LAST_BLOCK)
            self._last = widgets[-1]
            self._last.add_class(LAST_BLOCK, update=False)  # styled as it registers
        return super().mount_all(widgets, before=before, after=after)


class AssistantReply(Vertical):
    """A reply: Markdown that grows as tokens stream in, and a note on how it ended.

    Rendering is the UI's one real cost while tokens stream, so a reply renders only while it
    can be seen: text that arrives before the widget is mounted, or while its tab is hidden
    (`live` False), is held and rendered in one append when it can be seen again.

    A long reply must stream as fast as a short one. Streamed text goes through Textual's
    MarkdownStream, which appends to the document and re-parses only its last block; and a
    streaming reply is a column of Markdown parts of about PART_CHARS each, split between
    paragraphs (`part_break`), because Textual lays out every block of a document whose last
    block grew: in one document of 10,000 tokens that layout, not the parse, was most of a
    frame's time. Only the last part changes; the others keep their layout.
    """

    _part: ReplyPart  # the last part, the one that grows (set by compose)
    _ending: Static  # how the reply ended, under the parts (set by compose)

    def __init__(self, message: ChatMessage) -> None:
        super().__init__()
        self.message = message
        self._stream: MarkdownStream | None = None
        self._ready = False
        self.live = True  # its tab is shown (ChatPane keeps this in step)
        self._held: list[str] = []  # text not rendered yet
        self._finished = message.finish_reason is not None
        self._part_text = ""  # what streamed into the part that grows (self._part)

    def compose(self) -> ComposeResult:
        # The message already holds every piece appended so far (the pane extends the
        # session before it appends here), so the document starts from it, held text and all.
        self._held.clear()
        self._part = ReplyPart(self.message.content or None)
        self._ending = Static("", classes="ending", markup=False)
        yield self._part
        yield self._ending

    @property
    def parts(self) -> list[Markdown]:
        return list(self.query_children(Markdown))

    @property
    def source(self) -> str:
        """The Markdown rendered so far, every part of it."""
        return "".join(part.source for part in self.parts)

    async def on_mount(self) -> None:
        self._ready = True
        if self.message.finish_reason is None:
            self._set_ending("…", "waiting")
        else:
            self._show_ending(self.message.finish_reason, self.message.error)
        await self.catch_up()

    async def append(self, text: str) -> None:
        """Stream more Markdown in (held while the reply cannot be seen)."""
        if not text:
            return
        self._held.append(text)
        if self._ready and self.live:
            await self._render_held()

    async def catch_up(self) -> None:
        """Render what was held while the reply could not be seen (its tab is shown again)."""
        if self._ready and self.live and self._held:
            await self._render_held()

    async def finish(self, finish_reason: str, error: str | None = None) -> None:
        self._finished = True
        if not self._ready:
            return  # on_mount shows the message's ending
        await self._stop_stream()  # renders what it still holds (nothing while hidden)
        self._show_ending(finish_reason, error)

    async def _render_held(self) -> None:
        text = "".join(self._held)
        self._held.clear()
        cut = part_break(self._part_text, text, PART_CHARS)
        if cut is not None:
            await self._write(text[:cut])
            await self._next_part()
            text = text[cut:]
        await self._write(text)

    async def _write(self, text: str) -> None:
        if not text:
            return
        self._part_text += text
        if self._finished:  # the tab was hidden while the reply ended: one append
            await self._part.append(text)
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self._part)
            self._set_ending("", None)
        await self._stream.write(text)

    async def _next_part(self) -> None:
        await self._stop_stream()
        # The part's last block loses its bottom margin (tinychat.tcss); the part keeps it.
        self._part.styles.margin = (0, 0, 1, 0)
        self._part = ReplyPart()
        self._part_text = ""
        await self.mount(self._part, before=self._ending)

    async def _stop_stream(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None

    def _show_ending(self, finish_reason: str, error: str | None) -> None:
        if finish_reason == "error":
            self._set_ending(f"⚠ The engine failed this reply: {error or 'unknown error'}", "error")
        else:
            self._set_ending(_ENDINGS.get(finish_reason, ""), None)

    def _set_ending(self, text: str, kind: str | None) -> None:
        # Held, not queried: an update may reach a reply as it leaves the screen.
        ending = self._ending
        ending.update(text)
        ending.display = bool(text)
        ending.set_class(kind == "error", "error")
        ending.set_class(kind == "waiting", "waiting")
