"""One chat tab: a scrolling conversation above a message box, bound to one ChatSession.

The pane is the session's view and controller: it sends the user's messages through the
engine client, renders the reply as it streams, and applies stop, regenerate, reset and undo
to both the session (which stores them) and the screen.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static, TabPane

from chat_app.bridge import StreamUpdate
from chat_app.engine_client import EngineClient, EngineUnavailable
from chat_app.export import export_session
from chat_app.session import ChatSession
from chat_app.widgets.chat_input import ChatInput
from chat_app.widgets.messages import AssistantReply, Notice, UserMessage
from gpu.outputs import RequestMetrics

WELCOME = "Ask anything. Enter sends, Ctrl+J adds a line, F1 lists every shortcut."


class ChatPane(TabPane):
    """A chat tab."""

    BINDINGS = [
        Binding("up", "recall", "Recall last message", id="recall_last", show=False, priority=True),
        Binding("pageup", "scroll_log(-1)", "Scroll up", id="scroll_up", show=False, priority=True,
                tooltip="Scroll the conversation up a page"),
        Binding("pagedown", "scroll_log(1)", "Scroll down", id="scroll_down", show=False,
                priority=True, tooltip="Scroll the conversation down a page"),
    ]  # fmt: skip

    class Changed(Message):
        """The pane's title or streaming state changed (the screen relabels tabs, saves)."""

        def __init__(self, pane: ChatPane) -> None:
            super().__init__()
            self.pane = pane

    def __init__(self, session: ChatSession, client: EngineClient, *, id: str) -> None:
        super().__init__(session.title, id=id)
        self.session = session
        self._client = client
        self._request_id: str | None = None
        self._waiting_for_engine = False  # a message was sent before the model was ready
        self._recall_index: int | None = None
        self._reply: AssistantReply | None = None  # the reply being streamed
        self.last_metrics: RequestMetrics | None = None
        self._out_of_view = 0  # the oldest turns the model no longer sees, as last shown

    # -- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # The log never takes focus: the message box keeps it, and PageUp/PageDown scroll the
        # log from there. (A focusable log in a tab being hidden would get the focus back from
        # Textual, and with it its tab would be shown again.)
        with VerticalScroll(classes="chat-log", can_focus=False):
            yield Static(WELCOME, classes="welcome")
            yield from self._message_widgets()
        yield ChatInput(placeholder="Message  (Enter: send · Ctrl+J: new line · ↑: last message)")

    def on_mount(self) -> None:
        self.log_view.anchor()  # follow the stream until the user scrolls up
        self._show_welcome()

    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one(".chat-log", VerticalScroll)

    @property
    def input(self) -> ChatInput:
        return self.query_one(ChatInput)

    @property
    def replying(self) -> bool:
        return self._request_id is not None or self._waiting_for_engine

    def _message_widgets(self) -> list[Widget]:
        return [
            UserMessage(m) if m.role == "user" else AssistantReply(m) for m in self.session.messages
        ]

    def _show_welcome(self) -> None:
        self.query_one(".welcome").display = not self.session.messages

    async def _rerender(self) -> None:
        """Rebuild the conversation from the session (after reset and undo)."""
        log = self.log_view
        await log.remove_children([w for w in log.children if not w.has_class("welcome")])
        await log.mount_all(self._message_widgets())
        self._show_welcome()
        log.scroll_end(animate=False)

    async def _add(self, *widgets: Widget) -> None:
        await self.log_view.mount_all(widgets)
        self._show_welcome()
        self.log_view.scroll_end(animate=False)  # sending re-pins the view to the bottom

    async def notice(self, text: str, *, error: bool = False) -> None:
        await self._add(Notice(text, error=error))

    def _changed(self) -> None:
        self.post_message(self.Changed(self))

    # -- sending ----------------------------------------------------------------------------

    async def on_chat_input_submitted(self, event: ChatInput.Submitted) -> None:
        event.stop()
        await self.send(event.text)

    async def send(self, text: str) -> None:
        """Send a user message and start the reply (or say why not)."""
        text = text.strip()
        if not text:
            return
        if self.replying:
            self.app.notify("A reply is still coming: stop it first (Escape).", severity="warning")
            return
        if (load_error := self._client.load_error) is not None:
            await self.notice(f"Cannot send: the model failed to load: {load_error}", error=True)
            return
        self._recall_index = None
        self.input.clear()
        user = UserMessage(self.session.add_user(text))
        if self._client.loading:
            await self._add(user)
            self._waiting_for_engine = True
            await self.notice("The model is still loading: your message goes out when it is ready.")
        elif not await self._request_reply(user):
            # Refused (longer than the context, say): hand the text back for editing.
            self.session.remove_last_user()
            self.input.show_text(text)
        self._changed()

    async def _request_reply(self, *before: Widget) -> bool:
        """Ask for a reply to the conversation as it stands (it ends with the user's turn);
        `before` (the user's message) is shown with it. The request is queued before anything
        is mounted: the engine starts while the widgets are laid out."""
        try:
            started = self._client.start_reply(
                self.session.prompt_messages(),
                self.session.settings.sampling_params(),
                self,
                label=self.id or "chat",
            )
        except (EngineUnavailable, ValueError) as error:
            await self._add(Notice(f"Not sent: {error}", error=True))
            return False
        # No await between queueing the request and recording it: updates for it are
        # delivered between awaits, and must find this pane ready for them.
        self._request_id = started.request_id
        self.last_metrics = None
        self._reply = AssistantReply(self.session.begin_reply())
        widgets: list[Widget] = list(before)
        if started.dropped_turns > self._out_of_view:
            widgets.append(Notice(_out_of_view_text(started.dropped_turns)))
        self._out_of_view = started.dropped_turns
        await self._add(*widgets, self._reply)
        return True

    async def engine_ready(self) -> None:
        """The model finished loading: send what waited for it."""
        if self._waiting_for_engine:
            self._waiting_for_engine = False
            await self._request_reply()
            self._changed()

    async def engine_failed(self, message: str) -> None:
        if self._waiting_for_engine:
            self._waiting_for_engine = False
            self._changed()
        await self.notice(f"The model failed to load: {message}", error=True)

    # -- streaming --------------------------------------------------------------------------

    async def on_show(self) -> None:
        """The tab is shown: render what its replies held while it was hidden."""
        for reply in self.log_view.query(AssistantReply):
            reply.live = True
            await reply.catch_up()

    async def on_stream_update(self, update: StreamUpdate) -> None:
        """An update for this pane's reply, merged per frame by the bridge."""
        if update.request_id != self._request_id:
            return
        reply = self._reply
        assert reply is not None
        if update.metrics is not None:
            self.last_metrics = update.metrics
        if update.text:
            self.session.extend_reply(update.text)
            reply.live = self.display  # a hidden tab holds its text until it is shown
            await reply.append(update.text)
        if update.finished:
            reason = update.finish_reason or ("error" if update.error else "stop")
            self._request_id = None
            self.session.finish_reply(reason, update.error)
            await reply.finish(reason, update.error)
            self._changed()

    async def stop(self) -> bool:
        """Stop the reply in progress; what streamed so far stays. False if there was none."""
        if self._waiting_for_engine:
            self._waiting_for_engine = False
            await self.notice("Not sent: stopped before the model was ready.")
            self._changed()
            return True
        if self._request_id is None:
            return False
        self._client.stop_reply(self._request_id)
        self._request_id = None
        self.session.finish_reply("abort")
        if self._reply is not None:
            await self._reply.finish("abort")
        self._changed()
        return True

    # -- commands ---------------------------------------------------------------------------

    async def regenerate(self) -> None:
        await self.stop()
        dropped = self.session.drop_last_reply()
        if dropped is not None:
            for widget in self.log_view.query(AssistantReply):
                if widget.message is dropped:
                    await widget.remove()
        if not self.session.ends_with_user:
            self.app.notify("Nothing to regenerate yet.", severity="warning")
            return
        await self._request_reply()
        self._changed()

    async def reset(self) -> bool:
        """Clear the chat (stopping its reply, which frees its KV blocks); undoable."""
        await self.stop()
        if not self.session.reset():
            return False
        await self._rerender()
        self._changed()
        return True

    async def undo_reset(self) -> bool:
        if not self.session.undo_reset():
            return False
        await self._rerender()
        self._changed()
        return True

    def export(self, folder: Path, model_name: str | None) -> Path:
        return export_session(self.session, folder, model_name)

    # -- recalling the last message with Up -------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "recall":
            # Up recalls only from an empty box (or to step further back through what it
            # recalled); anywhere else it moves the cursor as usual.
            texts = self.session.user_texts()
            box = self.input
            if not texts or not box.has_focus:
                return False
            if not box.text:
                return True
            return (
                self._recall_index is not None
                and box.text == texts[self._recall_index]
                and box.cursor_location[0] == 0
                and self._recall_index > 0
            )
        return True

    def action_scroll_log(self, pages: int) -> None:
        """Scroll the conversation; scrolling up unpins it from the bottom until it is back."""
        if pages < 0:
            self.log_view.scroll_page_up()
        else:
            self.log_view.scroll_page_down()

    def action_recall(self) -> None:
        texts = self.session.user_texts()
        if not self.input.text or self._recall_index is None:
            self._recall_index = len(texts) - 1
        else:
            self._recall_index -= 1
        self.input.show_text(texts[self._recall_index])


def _out_of_view_text(turns: int) -> str:
    what = "The oldest turn is" if turns == 1 else f"The {turns} oldest turns are"
    return f"{what} out of the model's view now (the context is full); the history keeps them."
