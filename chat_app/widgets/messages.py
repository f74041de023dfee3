"""How a conversation looks: the user's messages, the model's replies, and notices."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
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


class AssistantReply(Vertical):
    """A reply: Markdown that grows as tokens stream in, and a note on how it ended.

    Rendering is the UI's one real cost while tokens stream, so a reply renders only while it
    can be seen: text that arrives before the widget is mounted, or while its tab is hidden
    (`live` False), is held and rendered in one append when it can be seen again. Streamed text
    goes through Textual's MarkdownStream, which appends to the document and re-parses only
    its last block, so an update costs the same at the 10,000th token as at the first.
    """

    def __init__(self, message: ChatMessage) -> None:
        super().__init__()
        self.message = message
        self._stream: MarkdownStream | None = None
        self._ready = False
        self.live = True  # its tab is shown (ChatPane keeps this in step)
        self._held: list[str] = []  # text not rendered yet
        self._finished = message.finish_reason is not None

    def compose(self) -> ComposeResult:
        # The message already holds every piece appended so far (the pane extends the
        # session before it appends here), so the document starts from it, held text and all.
        self._held.clear()
        yield Markdown(self.message.content or None)
        yield Static("", classes="ending", markup=False)

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

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
        if self._stream is not None:
            await self._stream.stop()  # renders what it still holds (nothing while hidden)
            self._stream = None
        self._show_ending(finish_reason, error)

    async def _render_held(self) -> None:
        text = "".join(self._held)
        self._held.clear()
        if self._finished:  # the tab was hidden while the reply ended: one append
            await self.markdown.append(text)
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self.markdown)
            self._set_ending("", None)
        await self._stream.write(text)

    def _show_ending(self, finish_reason: str, error: str | None) -> None:
        if finish_reason == "error":
            self._set_ending(f"⚠ The engine failed this reply: {error or 'unknown error'}", "error")
        else:
            self._set_ending(_ENDINGS.get(finish_reason, ""), None)

    def _set_ending(self, text: str, kind: str | None) -> None:
        ending = self.query_one(".ending", Static)
        ending.update(text)
        ending.display = bool(text)
        ending.set_class(kind == "error", "error")
        ending.set_class(kind == "waiting", "waiting")
