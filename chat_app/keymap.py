"""User-remappable keys: a JSON file of binding id -> keys, applied with App.set_keymap.

Every tinychat shortcut is a Binding with an id (the help screen lists them), so
`{"new_chat": "ctrl+t", "close_chat": "ctrl+x"}` in `<tinychat home>/keymap.json` moves
New and Close to other keys without touching the code.
"""

from __future__ import annotations

import json
from pathlib import Path

from chat_app.paths import keymap_path


def load_keymap(path: Path | None = None) -> tuple[dict[str, str], str | None]:
    """The keymap at `path` (default: the home's keymap.json) and an error to show, if any."""
    path = path if path is not None else keymap_path()
    if not path.exists():
        return {}, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return {}, f"Ignored the keymap {path}: {error}"
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        return {}, f'Ignored the keymap {path}: expected {{"binding_id": "key", ...}}'
    return data, None


def keymap_hint() -> str:
    return f'Remap keys in {keymap_path()}, e.g. {{"new_chat": "ctrl+t"}}  ·  Esc closes'
