"""A chat as a Markdown file: what Ctrl+E writes."""

from __future__ import annotations

import re
import time
from pathlib import Path

from chat_app.session import ChatSession

_NOTES = {
    "length": "_(cut at the token limit)_",
    "abort": "_(stopped)_",
    "interrupted": "_(interrupted)_",
}


def session_markdown(session: ChatSession, model_name: str | None = None) -> str:
    """The conversation as Markdown: a heading per turn, replies verbatim."""
    lines = [f"# {session.title}", ""]
    meta = [f"Exported {time.strftime('%Y-%m-%d %H:%M')}"]
    if model_name:
        meta.append(f"model: {model_name}")
    lines += [" · ".join(meta), ""]
    if session.settings.system_prompt.strip():
        lines += ["## System", "", session.settings.system_prompt.strip(), ""]
    for message in session.messages:
        lines += [f"## {'You' if message.role == 'user' else 'Assistant'}", ""]
        lines += [message.content.rstrip() or "_(no text)_", ""]
        if message.error:
            lines += [f"_(error: {message.error})_", ""]
        elif note := _NOTES.get(message.finish_reason or ""):
            lines += [note, ""]
    return "\n".join(lines).rstrip() + "\n"


def export_session(session: ChatSession, folder: Path, model_name: str | None = None) -> Path:
    """Write the chat to `folder/tinychat-<id>-<title>.md` (never over another file)."""
    folder.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", session.title).strip("-").lower()[:40] or "chat"
    stem = f"tinychat-{session.id or 'new'}-{slug}"
    path = folder / f"{stem}.md"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.md"
    path.write_text(session_markdown(session, model_name), encoding="utf-8")
    return path.resolve()
