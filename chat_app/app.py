"""The tinychat Textual app: opens at once, loads the model in a background thread, and carries
the engine's streams to the chat tabs.

    TinyChatApp(engine_factory=..., store=HistoryStore.open()).run()

`engine_factory` builds an engine thread (slow: it loads weights), so it runs off the UI
thread; until it returns, the UI is usable and says "loading model…". Everything the engine
sends comes back through one OutputBridge, drained at most once per frame.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from chat_app.bridge import DEFAULT_FPS, OutputBridge, OutputsReady
from chat_app.chat_screen import ChatScreen
from chat_app.engine_api import EngineFactory, EngineThread
from chat_app.engine_client import EngineClient
from chat_app.gc_tuning import tune_gc_for_frames
from chat_app.help_screen import HelpScreen
from chat_app.history import HistoryStore
from chat_app.paths import screenshots_path
from chat_app.session import ChatSession, ChatSettings
from chat_app.settings_screen import SettingsScreen
from chat_app.ui_priority import yield_cores_to_a_cpu_engine
from chat_app.widgets.chat_input import ChatInput
from chat_app.widgets.chat_pane import ChatPane

__all__ = ["TinyChatApp"]


class EngineLoaded(Message):
    """The loader thread built the engine thread and started it."""

    def __init__(self, thread: EngineThread) -> None:
        super().__init__()
        self.thread = thread


class EngineFailed(Message):
    """The model could not be loaded; `error` says why, for the user."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class TinyChatApp(App[int]):
    """Chat tabs over one engine."""

    CSS_PATH = "tinychat.tcss"
    TITLE = "tinychat"
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True,
                tooltip="Quit (stops every reply; the chats are saved)"),
        # show=False: the footer docks the palette's key on its right by itself.
        Binding("ctrl+p", "command_palette", "Commands", id="command_palette", priority=True,
                show=False, tooltip="Search every command"),
    ]  # fmt: skip

    def __init__(
        self,
        engine_factory: EngineFactory | None,
        store: HistoryStore | None = None,
        *,
        defaults: ChatSettings | None = None,
        fresh: bool = False,
        resume: int | None = None,
        keymap: dict[str, str] | None = None,
        notices: list[str] | None = None,
        export_dir: Path | None = None,
        screenshot_dir: Path | None = None,
        stats_interval: float = 0.5,
        fps: float = DEFAULT_FPS,
        yield_to_cpu_engine: bool = False,
    ) -> None:
        """yield_to_cpu_engine: the UI thread lowers its priority for good once an engine on
        the CPU is loaded (chat_app/ui_priority.py): for the thread that runs the app to its
        end, as `tinychat` and `tinychat bench app` do, not for a test runner's."""
        super().__init__()
        self._yield_to_cpu_engine = yield_to_cpu_engine
        self._engine_factory = engine_factory
        self._loads: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()  # the loader's
        self.store = store
        self.defaults = defaults or ChatSettings()
        self.keymap = dict(keymap or {})
        self._fresh = fresh
        self._resume = resume
        self._notices = list(notices or [])
        self._export_dir = export_dir
        self._screenshot_dir = screenshot_dir
        self._stats_interval = stats_interval
        self.bridge = OutputBridge(self, fps=fps)
        self.client = EngineClient(self.bridge)

    @classmethod
    def binding_ids(cls) -> set[str]:
        """The id of every shortcut the app has: what a keymap may name."""
        owners = (ChatInput, ChatPane, ChatScreen, HelpScreen, SettingsScreen, cls)
        return {b.id for owner in owners for b in owner.BINDINGS if isinstance(b, Binding) and b.id}

    # -- start-up ---------------------------------------------------------------------------

    def get_default_screen(self) -> ChatScreen:
        return ChatScreen(
            self.client,
            self.store,
            self.defaults,
            self._restore_sessions(),
            export_dir=self._export_dir,
            stats_interval=self._stats_interval,
        )

    @property
    def chat_screen(self) -> ChatScreen:
        screen = self.screen_stack[0]
        assert isinstance(screen, ChatScreen)
        return screen

    def _restore_sessions(self) -> list[ChatSession]:
        """The tabs that were open last time (unless --fresh), plus the one --resume names."""
        store = self.store
        if store is None:
            return []
        if store.notice:
            self._notices.append(store.notice)
        store.purge_reset()  # a reset not undone before quitting is final
        ids = [] if self._fresh else store.open_tabs()
        if self._resume is not None:
            ids = [i for i in ids if i != self._resume] + [self._resume]
        sessions = []
        for session_id in ids:
            record = store.load_session(session_id)
            if record is None:
                self._notices.append(f"There is no chat {session_id} in the history.")
                continue
            settings = ChatSettings.from_json(record.settings, replace(self.defaults))
            sessions.append(
                ChatSession(
                    settings, store, session_id=record.id, title=record.title,
                    messages=record.messages,
                )
            )  # fmt: skip
        return sessions

    def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)
        for notice in self._notices:  # paths and errors: no markup, "[...]" is text
            self.notify(notice, severity="warning", timeout=15, markup=False)
        if self._engine_factory is None:
            self.client.fail("no engine configured")
        else:
            # A daemon thread rather than a @work(thread=True) worker: Textual's workers run
            # in an executor that Python joins at exit, so quitting during a long load (CUDA
            # kernels compiling, say) would hang until the load finished. One thread for every
            # load, started here: engines started from it keep the default priority when the
            # UI thread has given its own up (chat_app/ui_priority.py).
            threading.Thread(target=self._loader, daemon=True, name="tinychat-loader").start()
            self._loads.put(partial(self._load_engine, self._engine_factory))

    def _loader(self) -> None:
        while True:
            self._loads.get()()

    def _load_engine(self, factory: EngineFactory) -> None:
        """Build the engine and start it (on the loader thread); report back with a message
        either way."""
        try:
            thread = factory()
            thread.start()
        except Exception as error:  # whatever went wrong, the user must be told
            self.post_message(EngineFailed(f"{type(error).__name__}: {error}"))
        else:
            self.post_message(EngineLoaded(thread))

    def restart_engine(self) -> None:
        """Build a new engine in place of the current one (its process stopped, say): the
        old one is shut down and the new one loads off the UI thread, as at start-up."""
        factory = self._engine_factory
        if factory is None:
            return
        old = self.client.detach()

        def reload() -> None:
            if old is not None:
                old.shutdown()
            self._load_engine(factory)

        self._loads.put(reload)

    async def on_engine_loaded(self, message: EngineLoaded) -> None:
        self.client.attach(message.thread)
        device = message.thread.engine.device
        self.bridge.pace_for(device)
        if self._yield_to_cpu_engine:
            yield_cores_to_a_cpu_engine(device)
        tune_gc_for_frames()  # start-up is over: its heap is frozen (chat_app/gc_tuning.py)
        await self.chat_screen.engine_ready()

    async def on_engine_failed(self, message: EngineFailed) -> None:
        self.client.fail(message.error)
        self.notify(
            f"The model failed to load: {message.error}", severity="error", timeout=30, markup=False
        )
        await self.chat_screen.engine_failed(message.error)

    # -- streaming --------------------------------------------------------------------------

    async def on_outputs_ready(self, _: OutputsReady) -> None:
        """The engine has sent something: deliver it now, or at the next frame if one was
        just drawn (the bridge posts nothing more until it is drained)."""
        delay = self.bridge.delay_until_next_frame()
        if delay > 0:
            self.set_timer(delay, self._deliver)
        else:
            await self._deliver()

    async def _deliver(self) -> None:
        rereading = self.client.num_rereading
        for sink, update in self.client.take_updates():
            await sink.on_stream_update(update)
        if self.client.num_rereading != rereading:  # a first token ended "re-reading the chat"
            self.chat_screen.refresh_status()

    # -- the command palette's system commands ----------------------------------------------

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's own commands, with Screenshot saving into the tinychat home (Textual's
        saves into a Downloads folder, which a server or a container often lacks)."""
        for command in super().get_system_commands(screen):
            if command.title == "Screenshot":
                folder = self._screenshot_dir or screenshots_path()
                yield SystemCommand(
                    "Screenshot",
                    f"Save the screen as an SVG file in {folder}",
                    # After a moment: the palette closes first, and is not in the picture.
                    lambda: self.set_timer(0.1, self.save_screen),
                )
            else:
                yield command

    def save_screen(self) -> Path | None:
        """Save an SVG of the screen and toast its whole path; None (and a toast) if it
        could not be written."""
        folder = self._screenshot_dir or screenshots_path()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = Path(self.save_screenshot(path=str(folder))).resolve()
        except OSError as error:
            self.notify(f"The screenshot failed: {error}", severity="error", markup=False)
            return None
        self.notify(f"Screen saved to {path}", title="Screenshot", markup=False)
        return path

    # -- quitting ---------------------------------------------------------------------------

    async def action_quit(self) -> None:
        """Stop every reply (what streamed is saved), remember the tabs, stop the engine."""
        await self.chat_screen.stop_all()
        await self._shutdown_engine()
        self.exit(0)

    async def _shutdown_engine(self) -> None:
        await asyncio.to_thread(self.client.shutdown)

    async def on_unmount(self) -> None:
        await self._shutdown_engine()  # idempotent: also covers exits that skip action_quit
