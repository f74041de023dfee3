"""Ctrl+S: a chat's system prompt and sampling settings, checked before they are applied.

The check is the engine's own: the form builds a ChatSettings and asks it for SamplingParams,
whose ValueError message is shown as is. An invalid form is never applied.
"""

from __future__ import annotations

from dataclasses import replace

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

from chat_app.session import ChatSettings

# (field, label, parse): parse turns the text into the value or raises ValueError.
FIELDS = [
    ("temperature", "Temperature (0 = greedy)", float),
    ("top_p", "Top-p (0, 1]", float),
    ("top_k", "Top-k (0 = off)", int),
    ("min_p", "Min-p [0, 1]", float),
    ("max_tokens", "Max tokens", int),
    ("seed", "Seed (empty = random)", lambda text: int(text) if text else None),
    ("repetition_penalty", "Repetition penalty (1 = off)", float),
]


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Edits a copy of the settings; dismisses with the new settings, or None if cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="settings_cancel"),
        Binding("ctrl+s", "save", "Save", id="settings_save", priority=True),
    ]

    def __init__(self, settings: ChatSettings) -> None:
        super().__init__()
        self._settings = settings

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-dialog"):
            yield Static(
                "Settings of this chat (applied to the next message)", classes="dialog-title"
            )
            yield Label("System prompt")
            yield TextArea(self._settings.system_prompt, id="system_prompt")
            with Grid(id="settings-grid"):
                for name, label, _ in FIELDS:
                    value = getattr(self._settings, name)
                    yield Label(label)
                    yield Input("" if value is None else str(value), id=name, compact=True)
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def read_form(self) -> ChatSettings:
        """The settings the form describes; ValueError with a readable message if invalid."""
        values: dict[str, object] = {}
        for name, label, parse in FIELDS:
            text = self.query_one(f"#{name}", Input).value.strip()
            try:
                values[name] = parse(text)
            except ValueError:
                raise ValueError(f"{label}: {text!r} is not a valid number") from None
        system_prompt = self.query_one("#system_prompt", TextArea).text
        settings = replace(self._settings, system_prompt=system_prompt, **values)
        settings.sampling_params()  # the engine's validation; raises ValueError
        return settings

    @on(Button.Pressed, "#save")
    @on(Input.Submitted)
    def action_save(self) -> None:
        try:
            settings = self.read_form()
        except ValueError as error:
            self.query_one("#settings-error", Static).update(f"Not saved: {error}")
            return
        self.dismiss(settings)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
