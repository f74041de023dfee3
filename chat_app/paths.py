"""Where the app keeps its files: under the tinychat home that the weights package defines
(`$TINYCHAT_HOME`, else the user's cache directory), next to the models."""

from __future__ import annotations

from pathlib import Path

from weights import tinychat_home


def history_path() -> Path:
    """The SQLite file that holds every chat."""
    return tinychat_home() / "history.db"


def keymap_path() -> Path:
    """An optional JSON file mapping binding ids to keys, e.g. {"new_chat": "ctrl+t"}."""
    return tinychat_home() / "keymap.json"


def exports_path() -> Path:
    """Where Ctrl+E writes chats as Markdown: the home, never the folder the app started in."""
    return tinychat_home() / "exports"


def screenshots_path() -> Path:
    """Where the command palette's Screenshot writes SVG files of the screen."""
    return tinychat_home() / "screenshots"
