"""keymap.json: the good entries apply, and one notice names every entry left out."""

from __future__ import annotations

import json
from pathlib import Path

from textual.binding import Binding

from chat_app.app import TinyChatApp
from chat_app.chat_screen import ChatScreen
from chat_app.help_screen import HelpScreen
from chat_app.keymap import is_key, load_keymap
from chat_app.settings_screen import SettingsScreen
from chat_app.widgets.chat_input import ChatInput
from chat_app.widgets.chat_pane import ChatPane


def write(folder: Path, data: object) -> Path:
    path = folder / "keymap.json"
    path.write_text(json.dumps(data))
    return path


def test_one_bad_entry_leaves_the_others_applied_and_is_named(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"new_chat": "ctrl+t", "close_chat": 5, "stop_reply": "ctlr+x", "export": "f8,ctrl+e"},
    )
    keymap, notice = load_keymap(path, TinyChatApp.binding_ids())
    assert keymap == {"new_chat": "ctrl+t", "export": "f8,ctrl+e"}
    assert notice is not None and str(path) in notice
    assert "applied 2 of 4 entries" in notice
    assert "close_chat (5 is not a key)" in notice
    assert 'stop_reply ("ctlr+x" is not a key)' in notice


def test_an_id_no_shortcut_has_is_named_not_ignored_silently(tmp_path: Path) -> None:
    path = write(tmp_path, {"new_tab": "ctrl+t", "quit": "ctrl+q"})
    keymap, notice = load_keymap(path, TinyChatApp.binding_ids())
    assert keymap == {"quit": "ctrl+q"}
    assert notice is not None and "new_tab (no shortcut has that id)" in notice


def test_a_file_that_is_no_json_object_is_ignored_whole(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert load_keymap(broken)[0] == {}
    keymap, notice = load_keymap(write(tmp_path, ["new_chat", "ctrl+t"]))
    assert keymap == {} and notice is not None and "binding_id" in notice


def test_every_key_the_app_binds_is_a_key_and_every_id_can_be_remapped() -> None:
    ids = TinyChatApp.binding_ids()
    owners = (ChatInput, ChatPane, ChatScreen, HelpScreen, SettingsScreen, TinyChatApp)
    for owner in owners:
        for binding in owner.BINDINGS:
            assert isinstance(binding, Binding) and binding.id in ids
            assert all(is_key(k) for k in binding.key.split(",")), binding.key
    assert {"new_chat", "send", "quit", "help_close", "settings_save", "tab_9"} <= ids
    for key in ("alt+shift+left", "question_mark", "space", "F8", "ctrl+", "super"):
        assert is_key(key) == (key in ("alt+shift+left", "question_mark", "space"))


def test_a_keymap_named_on_the_command_line_must_exist(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path))
    assert load_keymap() == ({}, None)  # the home's keymap.json is optional
    keymap, notice = load_keymap(tmp_path / "typo.json")
    assert keymap == {} and notice is not None and "typo.json" in notice
