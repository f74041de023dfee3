"""F1: every shortcut, with the keys that run it now (the user's keymap applied)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from chat_app.keymap import keymap_hint


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", id="help_close")]

    def __init__(self, shortcuts: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self._shortcuts = shortcuts

    def compose(self) -> ComposeResult:
        with Vertical(id="help-dialog"):
            yield Static("Shortcuts", classes="dialog-title")
            table: DataTable[str] = DataTable(cursor_type="row", zebra_stripes=True)
            table.add_columns("Keys", "Does", "Binding id")
            for keys, does, binding_id in self._shortcuts:
                table.add_row(keys, does, binding_id)
            yield table
            yield Static(keymap_hint(), classes="dialog-hint", markup=False)

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()
