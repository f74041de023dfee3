"""The message box: a TextArea where Enter sends and Shift+Enter or Ctrl+J starts a new line."""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class ChatInput(TextArea):
    """Multi-line input for a chat message: Enter sends, Shift+Enter (where the terminal
    reports it) and Ctrl+J (which every terminal sends) start a new line."""

    BINDINGS = [
        Binding("enter", "submit", "Send", id="send", show=False),
        Binding("shift+enter,ctrl+j", "newline", "New line", id="newline", show=False),
    ]

    async def _on_key(self, event: events.Key) -> None:
        """Run this box's own bindings here, in order with the characters typed before them.

        TextArea's key handler would take Enter as a newline. A priority binding would run in
        the App's loop, ahead of characters still queued for this widget (a fast typist, or
        `tmux send-keys "question" Enter`, would send half a message). So the box's own
        bindings, as the keymap has them, are run from its own key handler.
        """
        if not event.is_printable:
            active = self.screen.active_bindings.get(event.key)
            if active is not None and active.node is self and active.enabled:
                event.stop()
                event.prevent_default()
                await self.run_action(active.binding.action)
                return
        await super()._on_key(event)

    class Submitted(Message):
        """The user pressed Enter: `text` is what the box held."""

        def __init__(self, chat_input: ChatInput, text: str) -> None:
            super().__init__()
            self.chat_input = chat_input
            self.text = text

        @property
        def control(self) -> ChatInput:
            return self.chat_input

    def action_submit(self) -> None:
        self.post_message(self.Submitted(self, self.text))

    def action_newline(self) -> None:
        self.insert("\n")

    def show_text(self, text: str) -> None:
        """Replace the content, with the cursor at its end (ready to edit or send)."""
        self.load_text(text)
        self.move_cursor(self.document.end)
