"""One turn of a chat: what a session holds, the history store keeps and a tab renders.

A module of its own, below both chat_app/session.py and chat_app/history.py, so that the
session (which writes to the store) and the store (which reads turns back) never import each
other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ChatMessage:
    """One turn. An assistant message has `finish_reason` None while it streams."""

    role: str  # "user" | "assistant"
    content: str
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | "interrupted"
    error: str | None = None
    id: int | None = None  # row id in the history store
