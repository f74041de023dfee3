"""Fitting a long chat into the model's context: the oldest turns leave the prompt.

A chat grows without bound; the model sees at most `max_model_len` tokens, prompt and reply
together. When the prompt (chat template applied) leaves less than `reply_room` tokens for the
reply, whole turns are dropped from the front of the prompt, oldest first, as chat users
expect. The system prompt always stays and so does the newest user message; the dropped turns
stay in the session, on screen and in the history, only the model no longer sees them. When
even the system prompt and the newest message leave no room, the prompt goes out as it is and
the engine refuses it with its own clear error.

The token count is monotonic in the number of turns dropped, so the fewest drops that fit are
found by bisection: a few tokenizations even for a chat of hundreds of turns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Chat = list[dict[str, str]]

MAX_REPLY_ROOM = 256  # tokens kept free for the reply, in a context of 1024 tokens or more


def reply_room(max_model_len: int) -> int:
    """The fewest tokens a prompt leaves for the reply: min(256, a quarter of the context).

    A quarter keeps small contexts (`--max-model-len 512`) mostly history, and 256 tokens is
    a full chat answer without spending a large context on room most replies never use."""
    return min(MAX_REPLY_ROOM, max_model_len // 4)


@dataclass(frozen=True)
class FittedChat:
    """The prompt that goes to the engine, and how many of the oldest turns it leaves out."""

    messages: Chat
    prompt_ids: list[int]
    dropped_turns: int


def fit_chat(chat: Chat, encode: Callable[[Chat], list[int]], max_model_len: int) -> FittedChat:
    """The chat with the fewest oldest turns dropped that leaves `reply_room` for the reply.

    A turn is a user message and the replies after it. `encode` applies the chat template and
    tokenizes (with the generation prompt)."""
    system = [m for m in chat[:1] if m["role"] == "system"]
    rest = chat[len(system) :]
    starts = [i for i, m in enumerate(rest) if m["role"] == "user"]
    # Turn k starts at its user message; the first turn also takes anything before it. The
    # newest user message (the last start) is never dropped.
    droppable = max(len(starts) - 1, 0)
    limit = max_model_len - reply_room(max_model_len)

    def prompt(dropped: int) -> Chat:
        return system + rest[starts[dropped] if dropped else 0 :]

    ids = encode(chat)
    if len(ids) <= limit or droppable == 0:
        return FittedChat(chat, ids, 0)
    best = droppable
    best_ids = encode(prompt(droppable))
    low, high = 1, droppable - 1  # 0 does not fit; `best` is the fewest known to fit
    if len(best_ids) <= limit:
        while low <= high:
            mid = (low + high) // 2
            mid_ids = encode(prompt(mid))
            if len(mid_ids) <= limit:
                best, best_ids, high = mid, mid_ids, mid - 1
            else:
                low = mid + 1
    return FittedChat(prompt(best), best_ids, best)
