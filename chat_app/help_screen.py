"""F1: every shortcut, with the keys that run it now (the user's keymap applied).

The list is a Rich table in a scrolling box rather than a DataTable: its "Does" column wraps to
whatever width the terminal has, so no key, description or binding id is ever cut off (a
DataTable keeps each cell on one line and scrolls sideways instead).
"""

from __future__ import annotations

from rich import box
from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from chat_app.keymap import keymap_hint


def shortcuts_table(shortcuts: list[tuple[str, str, str]]) -> Table:
    """Keys, what they do and the binding id; only the middle column wraps."""
    table = Table(box=box.SIMPLE_HEAD, expand=True, pad_edge=False, show_edge=False)
    table.add_column("Keys", no_wrap=True, style="bold")
    table.add_column("Does", ratio=1)
    table.add_column("Binding id", no_wrap=True, style="dim")
    for keys, does, binding_id in shortcuts:
        table.add_row(keys, does, binding_id)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", id="help_close")]

    def __init__(self, shortcuts: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self._shortcuts = shortcuts

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-dialog"):
            yield Static("Shortcuts", classes="dialog-title")
            yield Static(shortcuts_table(self._shortcuts), id="help-table")
            yield Static(keymap_hint(), classes="dialog-hint", markup=False)

    def on_mount(self) -> None:
        self.query_one("#help-dialog").focus()  # Up/Down/PageUp/PageDown scroll a short screen
