"""User-remappable keys: a JSON file of binding id -> keys, applied with App.set_keymap.

Every tinychat shortcut is a Binding with an id (the help screen lists them), so
`{"new_chat": "ctrl+t", "close_chat": "ctrl+x"}` in `<tinychat home>/keymap.json` moves
New and Close to other keys without touching the code.

Entries are checked one by one: a typo in one (an id no shortcut has, a value that is not a
key) leaves that entry out and the others apply, and one notice names every entry left out.
Only a file that is not a JSON object at all is ignored whole.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from textual.keys import Keys, key_to_character

from chat_app.paths import keymap_path

MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})
# Textual's names of the keys that are not characters: "pagedown", "f8", "escape", ...
NAMED_KEYS = frozenset(
    key.value.rpartition("+")[2] for key in Keys if not key.value.startswith("<")
)


def is_key(key: str) -> bool:
    """True for a key as Textual names it: "ctrl+t", "f8", "alt+shift+left", "question_mark"."""
    *modifiers, name = key.strip().split("+")
    if not name or not all(m in MODIFIERS for m in modifiers):
        return False
    return len(name) == 1 or name in NAMED_KEYS or key_to_character(name) is not None


def _problem(binding_id: object, keys: object, binding_ids: Collection[str]) -> str | None:
    """Why an entry cannot be applied, or None if it can."""
    if binding_ids and binding_id not in binding_ids:
        return f"{binding_id} (no shortcut has that id)"
    if not isinstance(keys, str) or not keys.strip():
        return f"{binding_id} ({json.dumps(keys)} is not a key)"
    bad = [k.strip() for k in keys.split(",") if not is_key(k)]
    if bad:
        return f"{binding_id} ({', '.join(json.dumps(k) for k in bad)} is not a key)"
    return None


def load_keymap(
    path: Path | None = None, binding_ids: Collection[str] = ()
) -> tuple[dict[str, str], str | None]:
    """The good entries of the keymap at `path` (default: the home's keymap.json), and one
    notice naming the entries left out, if any. With `binding_ids`, an entry for any other
    id is left out too (it would never run anything)."""
    if path is not None and not path.exists():  # asked for by name (--keymap FILE)
        return {}, f"There is no keymap {path}: the default keys apply."
    path = path if path is not None else keymap_path()
    if not path.exists():
        return {}, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return {}, f"Ignored the keymap {path}: {error}"
    if not isinstance(data, dict):
        return {}, f'Ignored the keymap {path}: expected {{"binding_id": "key", ...}}'
    keymap, problems = {}, []
    for binding_id, keys in data.items():
        if (problem := _problem(binding_id, keys, binding_ids)) is not None:
            problems.append(problem)
        else:
            keymap[binding_id] = keys
    if not problems:
        return keymap, None
    applied = f"applied {len(keymap)} of {len(data)} entries" if keymap else "applied none"
    return keymap, f"Keymap {path}: {applied}; left out {'; '.join(problems)}. F1 lists the ids."


def keymap_hint() -> str:
    return f'Remap keys in {keymap_path()}, e.g. {{"new_chat": "ctrl+t"}}  ·  Esc closes'
