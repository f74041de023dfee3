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

    Updates can arrive before the widget has finished mounting (the engine is fast); they
    wait in `_early` and are applied by `on_mount`.
    """

    def __init__(self, message: ChatMessage) -> None:
        super().__init__()
        self.message = message
        self._stream: MarkdownStream | None = None
        self._ready = False
        self._early: list[str] = []
        self._early_finish: tuple[str, str | None] | None = None

    def compose(self) -> ComposeResult:
        yield Markdown(self.message.content or None)
        yield Static("", classes="ending", markup=False)

    async def on_mount(self) -> None:
        self._ready = True
        if self.message.finish_reason is None:
            self._set_ending("…", "waiting")
        else:
            self._show_ending(self.message.finish_reason, self.message.error)
        if self._early:
            await self.append("".join(self._early))
        if self._early_finish is not None:
            await self.finish(*self._early_finish)

    async def append(self, text: str) -> None:
        """Stream more Markdown in; the stream renders as fast as the screen allows."""
        if not self._ready:
            self._early.append(text)
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one(Markdown))
            self._set_ending("", None)
        await self._stream.write(text)

    async def finish(self, finish_reason: str, error: str | None = None) -> None:
        if not self._ready:
            self._early_finish = (finish_reason, error)
            return
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self._show_ending(finish_reason, error)

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
