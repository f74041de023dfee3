"""Alt+digit in real terminals.

Most terminals (xterm, GNOME Terminal, tmux, ...) send Alt+1 as ESC followed by "1". Textual
reads that pair as "¡" — the character macOS types for Option+1 — to suit WezTerm on macOS,
so the Alt+1..9 tab shortcuts would never fire there. tinychat gives the pairs back their
usual meaning. Terminals that report keys unambiguously (the kitty protocol) are unaffected.
"""

from __future__ import annotations


def read_escape_digit_as_alt() -> None:
    """Make ESC+digit parse as alt+digit (call before the app starts reading keys)."""
    try:
        from textual._ansi_sequences import ANSI_SEQUENCES_KEYS
    except ImportError:  # a Textual without the table: nothing to undo
        return
    if isinstance(ANSI_SEQUENCES_KEYS, dict):
        for digit in "123456789":
            ANSI_SEQUENCES_KEYS.pop(f"\x1b{digit}", None)
