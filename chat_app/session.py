"""A chat session: its messages and settings, and the rules for changing them.

Plain Python, no Textual: the tab widget renders a session, the history store keeps it, and
both can be tested without the other. Every change is written to the store as it happens, so
a crash loses at most the last second of a streaming reply.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from chat_app.chat_message import ChatMessage
from gpu.sampling_params import RequestOutputKind, SamplingParams
from gpu.sampling_presets import CHAT_DEFAULTS, CHAT_MAX_TOKENS

if TYPE_CHECKING:
    from chat_app.history import HistoryStore

TITLE_LENGTH = 40
SAVE_INTERVAL_S = 1.0  # how often a streaming reply is written to the store


@dataclass
class ChatSettings:
    """What a session asks of the engine; applied to the next message sent.

    The defaults are the engine's chat preset (gpu/sampling_presets.py), the setting that
    `tinychat bench --sampling chat` measures."""

    system_prompt: str = ""
    temperature: float = CHAT_DEFAULTS.temperature
    top_p: float = CHAT_DEFAULTS.top_p
    top_k: int = CHAT_DEFAULTS.top_k
    min_p: float = CHAT_DEFAULTS.min_p
    max_tokens: int = CHAT_MAX_TOKENS
    seed: int | None = None
    repetition_penalty: float = CHAT_DEFAULTS.repetition_penalty

    def sampling_params(self) -> SamplingParams:
        """The engine's parameters; raises ValueError (the engine's own words) if invalid."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            max_tokens=self.max_tokens,
            seed=self.seed,
            repetition_penalty=self.repetition_penalty,
            output_kind=RequestOutputKind.DELTA,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str, fallback: ChatSettings) -> ChatSettings:
        """Settings saved by an older or newer tinychat: known fields, else the fallback's."""
        try:
            saved = json.loads(text)
        except ValueError:
            saved = {}
        values = asdict(fallback)
        if isinstance(saved, dict):
            values.update({f.name: saved[f.name] for f in fields(cls) if f.name in saved})
        settings = cls(**values)
        try:
            settings.sampling_params()
        except (ValueError, TypeError):
            return fallback
        return settings


class ChatSession:
    """The conversation in one tab."""

    def __init__(
        self,
        settings: ChatSettings,
        store: HistoryStore | None = None,
        *,
        session_id: int | None = None,
        title: str = "",
        messages: list[ChatMessage] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.id = session_id
        self._store = store
        self._messages: list[ChatMessage] = list(messages or [])
        # A chat with no messages (one reset before the last quit) is titled by its next one.
        self._title = title if self._messages else ""
        self._undo: list[ChatMessage] | None = None  # what the last reset removed
        self._undo_title = ""
        self._clock = clock
        self._last_save = 0.0

    # -- reading ----------------------------------------------------------------------------

    @property
    def messages(self) -> list[ChatMessage]:
        return list(self._messages)

    @property
    def title(self) -> str:
        return self._title or "New chat"

    @property
    def replying(self) -> bool:
        """True while the last message is a reply still streaming."""
        return bool(self._messages) and self._messages[-1].finish_reason is None

    @property
    def ends_with_user(self) -> bool:
        """True when the user spoke last: the chat awaits a reply."""
        return bool(self._messages) and self._messages[-1].role == "user"

    @property
    def can_undo_reset(self) -> bool:
        return self._undo is not None

    def last_reply(self) -> str | None:
        for message in reversed(self._messages):
            if message.role == "assistant" and message.content:
                return message.content
        return None

    def user_texts(self) -> list[str]:
        """What the user sent, oldest first (for recalling with Up)."""
        return [m.content for m in self._messages if m.role == "user"]

    def prompt_messages(self, new_user_text: str | None = None) -> list[dict[str, str]]:
        """The conversation for the chat template: system prompt first, then every turn.

        The whole history goes every time: the engine's prefix cache recognises the earlier
        turns' tokens and prefills only what is new. The engine client drops the oldest turns
        from the prompt when the chat outgrows the context (chat_app/context_window.py); the
        session keeps them all.
        """
        chat = []
        if self.settings.system_prompt.strip():
            chat.append({"role": "system", "content": self.settings.system_prompt})
        for message in self._messages:
            if message.content:  # an empty reply (failed at once) is not part of the chat
                chat.append({"role": message.role, "content": message.content})
        if new_user_text is not None:
            chat.append({"role": "user", "content": new_user_text})
        return chat

    # -- changing ---------------------------------------------------------------------------

    def add_user(self, text: str) -> ChatMessage:
        """Append the user's message; it also makes the last reset permanent."""
        if self._undo is not None:
            self._undo = None
            if self._store is not None and self.id is not None:
                self._store.purge_reset(self.id)
        message = ChatMessage("user", text, finish_reason="stop")
        self._messages.append(message)
        if not self._title:  # a new chat, or the first message after a reset
            self._title = _title_from(text)
            if self._store is not None and self.id is not None:
                self._store.update_session(self.id, title=self._title)
        self._save_new(message)
        return message

    def remove_last_user(self) -> str | None:
        """Take back the last user message (the engine refused it); returns its text."""
        if not self._messages or self._messages[-1].role != "user":
            return None
        message = self._messages.pop()
        self._delete(message)
        if not self._messages and self._undo is None and self.id is not None:
            if self._store is not None:  # it was this chat's only message: no chat is left
                self._store.delete_session(self.id)
            self.id = None
            self._title = ""
        return message.content

    def begin_reply(self) -> ChatMessage:
        message = ChatMessage("assistant", "")
        self._messages.append(message)
        self._save_new(message)
        self._last_save = self._clock()
        return message

    def extend_reply(self, text: str) -> None:
        """Add streamed text; written to the store at most every SAVE_INTERVAL_S."""
        if not self.replying:
            return
        message = self._messages[-1]
        message.content += text
        now = self._clock()
        if now - self._last_save >= SAVE_INTERVAL_S:
            self._last_save = now
            self._update(message)

    def finish_reply(self, finish_reason: str, error: str | None = None) -> None:
        if not self.replying:
            return
        message = self._messages[-1]
        message.finish_reason = finish_reason
        message.error = error
        self._update(message)

    def drop_last_reply(self) -> ChatMessage | None:
        """Forget the last reply (to regenerate it); returns it, or None if there was none."""
        if not self._messages or self._messages[-1].role != "assistant":
            return None
        message = self._messages.pop()
        self._delete(message)
        return message

    def reset(self) -> bool:
        """Clear the conversation, keeping it aside so that `undo_reset` can bring it back.
        The title goes with it: the next message names the chat again."""
        if not self._messages:
            return False
        self._undo, self._undo_title = self._messages, self._title
        self._messages, self._title = [], ""
        if self._store is not None and self.id is not None:
            self._store.mark_reset(self.id)
        return True

    def undo_reset(self) -> bool:
        if self._undo is None:
            return False
        self._messages = self._undo + self._messages
        self._title = self._undo_title
        self._undo = None
        if self._store is not None and self.id is not None:
            self._store.unmark_reset(self.id)
        return True

    def update_settings(self, settings: ChatSettings) -> None:
        self.settings = settings
        if self._store is not None and self.id is not None:
            self._store.update_session(self.id, settings=settings.to_json())

    # -- persistence ------------------------------------------------------------------------

    def _save_new(self, message: ChatMessage) -> None:
        if self._store is None:
            return
        if self.id is None:  # a session reaches the store with its first message
            self.id = self._store.create_session(self._title, self.settings.to_json())
        message.id = self._store.add_message(self.id, message)

    def _update(self, message: ChatMessage) -> None:
        if self._store is not None and message.id is not None:
            self._store.update_message(message)

    def _delete(self, message: ChatMessage) -> None:
        if self._store is not None and message.id is not None:
            self._store.delete_message(message.id)


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"
