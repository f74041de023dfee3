"""The command palette's chat commands (Ctrl+P): every shortcut's action, and every tab.

The screen that opened the palette supplies the entries (`command_entries`), so the palette
always lists exactly what the key bindings do, under the same names as the footer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider


class _HasCommands(Protocol):
    def command_entries(self) -> list[tuple[str, str, Callable[[], object]]]: ...


class ChatCommands(Provider):
    """Commands of the chat screen."""

    def _entries(self) -> list[tuple[str, str, Callable[[], object]]]:
        return cast(_HasCommands, self.screen).command_entries()

    async def discover(self) -> Hits:
        for title, help_text, callback in self._entries():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._entries():
            if (score := matcher.match(title)) > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)
