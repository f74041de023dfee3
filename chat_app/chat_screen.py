"""The main screen: chat tabs, the status bar and the footer, and every chat shortcut.

The shortcuts live here rather than on the App so that they are inactive while a modal screen
(settings, help, the command palette) is on top. They are priority bindings because the message
box is a TextArea, which would otherwise take keys such as Ctrl+W, Ctrl+E, Ctrl+Y and Ctrl+Z
for its own editing. Where a shortcut has nothing to do (Escape with no reply streaming, Ctrl+Z
with no reset to undo), `check_action` says so and the key falls through to the TextArea.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, TabbedContent

from chat_app.commands import ChatCommands
from chat_app.engine_client import EngineClient
from chat_app.help_screen import HelpScreen
from chat_app.history import HistoryStore
from chat_app.paths import exports_path
from chat_app.session import ChatSession, ChatSettings
from chat_app.settings_screen import SettingsScreen
from chat_app.widgets.chat_pane import ChatPane
from chat_app.widgets.status_bar import StatusBar

TITLE_WIDTH = 24
BACKGROUND_MARKER = "● "  # a tab that is generating while another one is shown


class ChatScreen(Screen[None]):
    COMMANDS = Screen.COMMANDS | {ChatCommands}

    BINDINGS = [
        Binding("ctrl+n", "new_chat", "New", id="new_chat", priority=True,
                tooltip="Open a new chat tab"),
        Binding("ctrl+w", "close_chat", "Close", id="close_chat", priority=True,
                tooltip="Close this tab (stops its reply; the chat stays in the history)"),
        Binding("escape", "stop_reply", "Stop", id="stop_reply", priority=True,
                tooltip="Stop the reply being written (what streamed so far stays)"),
        Binding("ctrl+g", "regenerate", "Regenerate", id="regenerate", priority=True,
                show=False, tooltip="Write the last reply again"),
        Binding("ctrl+r", "reset_chat", "Reset", id="reset_chat", priority=True,
                tooltip="Clear this chat (undo it until the next message)"),
        Binding("ctrl+z", "undo_reset", "Undo reset", id="undo_reset", priority=True,
                tooltip="Bring back the chat that Reset cleared"),
        Binding("ctrl+s", "settings", "Settings", id="settings", priority=True,
                tooltip="System prompt and sampling settings of this chat"),
        Binding("ctrl+e", "export", "Export", id="export", priority=True, show=False,
                tooltip="Save this chat as a Markdown file"),
        Binding("ctrl+y", "copy_reply", "Copy reply", id="copy_reply", priority=True,
                show=False, tooltip="Copy the last reply to the clipboard"),
        Binding("f1", "help", "Help", id="help", tooltip="List every shortcut"),
        Binding("f5", "restart_engine", "Restart engine", id="restart_engine", show=False,
                priority=True, tooltip="Start the engine again (after its process stopped)"),
        Binding("ctrl+pagedown", "next_tab", "Next tab", id="next_tab", show=False,
                priority=True, tooltip="Show the next tab"),
        Binding("ctrl+pageup", "previous_tab", "Previous tab", id="previous_tab", show=False,
                priority=True, tooltip="Show the previous tab"),
        *(
            Binding(f"alt+{n}", f"switch_tab({n})", f"Tab {n}", id=f"tab_{n}", show=False,
                    priority=True, tooltip=f"Show tab {n}")
            for n in range(1, 10)
        ),
    ]  # fmt: skip

    def __init__(
        self,
        client: EngineClient,
        store: HistoryStore | None,
        defaults: ChatSettings,
        sessions: list[ChatSession],
        *,
        export_dir: Path | None = None,
        stats_interval: float = 0.5,
    ) -> None:
        super().__init__()
        self._client = client
        self._store = store
        self._defaults = defaults
        self._initial_sessions = sessions
        self._export_dir = export_dir
        self._stats_interval = stats_interval
        self._pane_ids = (f"chat-{n}" for n in itertools.count(1))
        self._tabs_ready = False  # engine news that comes earlier is handled by on_mount
        self._told_stopped = False  # the toast that the engine stopped, once per engine

    def compose(self) -> ComposeResult:
        yield TabbedContent(id="tabs")
        yield StatusBar()
        yield Footer(compact=True)

    async def on_mount(self) -> None:
        for session in self._initial_sessions or [self._new_session()]:
            await self.tabs.add_pane(self._pane_for(session))
        self.tabs.active = self.panes[-1 if self._initial_sessions else 0].id or ""
        self._relabel()
        self._tabs_ready = True
        if self._client.load_error is not None:  # it failed while the tabs were opening
            await self.active_pane.engine_failed(self._client.load_error)
        self.refresh_status()
        if self._stats_interval > 0:
            self.set_interval(self._stats_interval, self.sample_status)

    # -- tabs -------------------------------------------------------------------------------

    @property
    def tabs(self) -> TabbedContent:
        return self.query_one("#tabs", TabbedContent)

    @property
    def panes(self) -> list[ChatPane]:
        # The switcher's children, not a query of the whole tree: the footer asks (through
        # check_action) for every binding whenever bindings refresh, and a query would walk
        # every block of every reply in every tab.
        try:
            switcher = self.tabs.get_child_by_type(ContentSwitcher)
        except NoMatches:  # not composed yet
            return []
        return [child for child in switcher.children if isinstance(child, ChatPane)]

    @property
    def active_pane(self) -> ChatPane:
        pane = self.tabs.active_pane
        assert isinstance(pane, ChatPane)
        return pane

    def _new_session(self) -> ChatSession:
        return ChatSession(replace(self._defaults), self._store)

    def _pane_for(self, session: ChatSession) -> ChatPane:
        return ChatPane(session, self._client, id=next(self._pane_ids))

    def _relabel(self) -> None:
        """Tab labels: number (for Alt+N), title, and a marker on busy background tabs."""
        active = self.tabs.active
        for n, pane in enumerate(self.panes, 1):
            title = pane.session.title
            if len(title) > TITLE_WIDTH:
                title = title[: TITLE_WIDTH - 1] + "…"
            marker = BACKGROUND_MARKER if pane.replying and pane.id != active else ""
            try:
                tab = self.tabs.get_tab(pane)
            except NoMatches:
                continue  # closing: its tab went first
            label = f"{marker}{n} {title}"
            if tab.label_text != label:  # a relabel re-lays the tab bar out: only changes
                tab.label = Content(label)

    def _save_tabs(self) -> None:
        if self._store is not None:
            ids = [p.session.id for p in self.panes if p.session.id is not None]
            self._store.set_open_tabs(ids)

    @on(TabbedContent.TabActivated)
    def _tab_shown(self) -> None:
        self.active_pane.input.focus()
        self._relabel()
        self.refresh_status()

    @on(ChatPane.Changed)
    def _pane_changed(self, event: ChatPane.Changed) -> None:
        self._relabel()
        self._save_tabs()
        if event.pane is self.tabs.active_pane:  # the footer shows the active tab's actions
            self.refresh_bindings()  # Stop / Undo reset come and go from the footer
            self.refresh_status()

    def show_pane(self, pane: ChatPane) -> None:
        self.tabs.active = pane.id or ""

    # -- engine -----------------------------------------------------------------------------

    def sample_status(self) -> None:
        """The stats timer: refresh, and add a point to the tokens/s sparkline."""
        self.refresh_status(sample=True)

    def refresh_status(self, *, sample: bool = False) -> None:
        """Poll the engine's latest stats snapshot (cheap; never waits on the engine)."""
        status = self.query_one(StatusBar)
        if self._client.stopped:
            restart = self.key_for("restart_engine")
            status.show_model(f"the engine stopped · {restart} restarts it", failed=True)
            if not self._told_stopped:
                self._told_stopped = True
                self.notify(f"The engine stopped. {restart} restarts it.", severity="error")
        else:
            status.show_model(self._client.describe(), failed=self._client.load_error is not None)
        status.show_engine(self._client.stats(), sample=sample)
        if self.tabs.active_pane is not None:
            pane = self.active_pane
            status.show_tab(pane.last_metrics, rereading=self._client.rereading(pane))

    async def engine_ready(self) -> None:
        if not self._tabs_ready:
            return  # nothing can be waiting yet; on_mount shows the status
        self.refresh_status()
        for pane in self.panes:
            await pane.engine_ready()

    async def engine_failed(self, message: str) -> None:
        if not self._tabs_ready:
            return
        self.refresh_status()
        for pane in self.panes:
            if pane.replying or pane is self.active_pane:
                await pane.engine_failed(message)

    async def stop_all(self) -> None:
        """Stop every reply (keeping what streamed) and remember the open tabs: for quitting."""
        for pane in self.panes:
            await pane.stop()
        self._save_tabs()

    # -- actions ----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide what cannot be done now; the key then goes on to the focused widget."""
        if not self.is_mounted or self.tabs.active_pane is None:
            return True
        if action == "stop_reply":
            return self.active_pane.replying
        if action == "undo_reset":
            return self.active_pane.session.can_undo_reset
        if action == "switch_tab":
            (n,) = parameters
            return isinstance(n, int) and n <= len(self.panes)
        return True

    async def action_new_chat(self) -> None:
        pane = self._pane_for(self._new_session())
        await self.tabs.add_pane(pane)
        self.show_pane(pane)

    async def action_close_chat(self) -> None:
        pane = self.active_pane
        await pane.stop()
        await self.tabs.remove_pane(pane.id or "")
        if not self.panes:
            await self.action_new_chat()
        self._relabel()
        self._save_tabs()

    async def action_stop_reply(self) -> None:
        await self.active_pane.stop()

    async def action_restart_engine(self) -> None:
        """Stop every reply (what streamed stays) and start a new engine; messages sent
        meanwhile go out when it is ready, as at start-up."""
        if self._client.loading:
            self.notify("The engine is still starting.", severity="warning")
            return
        await self.stop_all()
        self._told_stopped = False
        self.app.restart_engine()  # type: ignore[attr-defined]
        self.refresh_status()

    async def action_regenerate(self) -> None:
        await self.active_pane.regenerate()

    async def action_reset_chat(self) -> None:
        if await self.active_pane.reset():
            self.notify(f"Chat cleared. {self.key_for('undo_reset')} brings it back.")
        else:
            self.notify("Nothing to reset.", severity="warning")

    async def action_undo_reset(self) -> None:
        if await self.active_pane.undo_reset():
            self.notify("Chat restored.")

    def action_settings(self) -> None:
        pane = self.active_pane

        def apply(settings: ChatSettings | None) -> None:
            if settings is not None:
                pane.session.update_settings(settings)
                self.notify("Settings saved: they apply from the next message.")

        self.app.push_screen(SettingsScreen(pane.session.settings), apply)

    def action_export(self) -> None:
        pane = self.active_pane
        if not pane.session.messages:
            self.notify("Nothing to export yet.", severity="warning")
            return
        model = self._client.thread.engine.model_name if self._client.thread else None
        try:
            path = pane.export(self._export_dir or exports_path(), model)
        except OSError as error:
            self.notify(f"Export failed: {error}", severity="error", markup=False)
            return
        self.notify(f"Chat exported to {path}", title="Exported", markup=False)

    def action_copy_reply(self) -> None:
        text = self.active_pane.session.last_reply()
        if text is None:
            self.notify("No reply to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied the last reply ({len(text)} characters).")

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.shortcuts()))

    def action_next_tab(self) -> None:
        self._cycle(+1)

    def action_previous_tab(self) -> None:
        self._cycle(-1)

    def _cycle(self, step: int) -> None:
        panes = self.panes
        index = panes.index(self.active_pane)
        self.show_pane(panes[(index + step) % len(panes)])

    def action_switch_tab(self, n: int) -> None:
        panes = self.panes
        if 1 <= n <= len(panes):
            self.show_pane(panes[n - 1])

    # -- what the help screen and the command palette list ----------------------------------

    def key_for(self, binding_id: str) -> str:
        """The key that runs a binding now (after the user's keymap), for messages."""
        for key, active in self.active_bindings.items():
            if active.binding.id == binding_id:
                return self.app.get_key_display(active.binding.with_key(key))
        return "?"

    def shortcuts(self) -> list[tuple[str, str, str]]:
        """(keys, what it does, binding id) for every binding with an id, keymap applied."""
        from chat_app.widgets.chat_input import ChatInput

        keymap = getattr(self.app, "keymap", {})
        rows = []
        for owner in (ChatInput, ChatPane, ChatScreen, type(self.app)):
            for binding in owner.BINDINGS:
                if not isinstance(binding, Binding) or binding.id is None:
                    continue
                keys = keymap.get(binding.id, binding.key).split(",")
                shown = " / ".join(self.app.get_key_display(binding.with_key(k)) for k in keys)
                if binding.id.startswith("tab_"):  # nine of a kind: one row says it
                    if binding.id == "tab_1":
                        rows.append((f"{shown} … 9", "Show tab 1 … 9", "tab_1 … tab_9"))
                    continue
                rows.append((shown, binding.tooltip or binding.description, binding.id))
        return rows

    def command_entries(self) -> list[tuple[str, str, Callable[[], object]]]:
        """(title, help, callback) for the command palette: every action, every tab."""
        entries: list[tuple[str, str, Callable[[], object]]] = []
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            if binding.id is None or binding.id.startswith("tab_"):
                continue
            entries.append((binding.description, binding.tooltip, _runner(self, binding.action)))
        for n, pane in enumerate(self.panes, 1):
            entries.append(
                (f"Go to tab {n}: {pane.session.title}", "Switch tab", _shower(self, pane))
            )
        return entries


def _runner(screen: ChatScreen, action: str) -> Callable[[], object]:
    return lambda: screen.run_action(action)


def _shower(screen: ChatScreen, pane: ChatPane) -> Callable[[], object]:
    return lambda: screen.show_pane(pane)
