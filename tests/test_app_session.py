"""ChatSession: the conversation model under the tabs (no Textual needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chat_app.history import HistoryStore
from chat_app.session import SAVE_INTERVAL_S, ChatSession, ChatSettings
from gpu.sampling_params import RequestOutputKind


@pytest.fixture
def store(tmp_path: Path):
    store = HistoryStore.open(tmp_path / "history.db")
    yield store
    store.close()


def test_prompt_starts_with_the_system_prompt_and_keeps_every_turn() -> None:
    session = ChatSession(ChatSettings(system_prompt="Be brief."))
    session.add_user("Hi")
    session.begin_reply()
    session.extend_reply("Hello!")
    session.finish_reply("stop")
    assert session.prompt_messages("And you?") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "And you?"},
    ]


def test_no_system_message_without_a_system_prompt_and_empty_replies_are_left_out() -> None:
    session = ChatSession(ChatSettings(system_prompt="  "))
    session.add_user("Hi")
    session.begin_reply()
    session.finish_reply("error", "boom")
    assert session.prompt_messages() == [{"role": "user", "content": "Hi"}]


def test_title_comes_from_the_first_message_and_is_shortened() -> None:
    session = ChatSession(ChatSettings())
    assert session.title == "New chat"
    session.add_user("What is   the capital of France, and why is it that city in particular?")
    assert session.title.startswith("What is the capital of France")
    assert len(session.title) == 40 and session.title.endswith("…")


def test_sampling_params_are_deltas_and_invalid_settings_raise_the_engines_message() -> None:
    params = ChatSettings(temperature=0.0, max_tokens=5, seed=3).sampling_params()
    assert params.output_kind is RequestOutputKind.DELTA
    assert (params.temperature, params.max_tokens, params.seed) == (0.0, 5, 3)
    with pytest.raises(ValueError, match="top_p"):
        ChatSettings(top_p=1.5).sampling_params()


def test_saved_settings_fall_back_field_by_field_and_wholesale_when_invalid() -> None:
    fallback = ChatSettings(temperature=0.3)
    assert ChatSettings.from_json('{"top_k": 5, "unknown": 1}', fallback) == ChatSettings(
        temperature=0.3, top_k=5
    )
    assert ChatSettings.from_json('{"temperature": -1}', fallback) == fallback
    assert ChatSettings.from_json("not json", fallback) == fallback


def test_reset_then_undo_restores_the_chat_in_memory_and_in_the_store(store) -> None:
    session = ChatSession(ChatSettings(), store)
    session.add_user("one")
    session.begin_reply()
    session.extend_reply("reply one")
    session.finish_reply("stop")
    assert session.reset()
    assert session.messages == [] and session.can_undo_reset
    assert store.load_session(session.id).messages == []
    assert session.undo_reset()
    assert [m.content for m in session.messages] == ["one", "reply one"]
    assert [m.content for m in store.load_session(session.id).messages] == ["one", "reply one"]
    assert not session.can_undo_reset


def test_a_new_message_makes_the_reset_final(store) -> None:
    session = ChatSession(ChatSettings(), store)
    session.add_user("one")
    session.reset()
    session.add_user("two")
    assert not session.can_undo_reset
    assert not session.undo_reset()
    assert [m.content for m in store.load_session(session.id).messages] == ["two"]


def test_drop_last_reply_is_how_regenerate_starts(store) -> None:
    session = ChatSession(ChatSettings(), store)
    session.add_user("q")
    session.begin_reply()
    session.extend_reply("a")
    session.finish_reply("stop")
    dropped = session.drop_last_reply()
    assert dropped is not None and dropped.content == "a"
    assert session.ends_with_user
    assert session.drop_last_reply() is None
    assert [m.content for m in store.load_session(session.id).messages] == ["q"]


def test_a_streaming_reply_is_saved_periodically_so_a_crash_keeps_it(store) -> None:
    now = [0.0]
    session = ChatSession(ChatSettings(), store, clock=lambda: now[0])
    session.add_user("q")
    session.begin_reply()
    session.extend_reply("Hello")
    assert store.load_session(session.id).messages[-1].content == ""  # not yet: too soon
    now[0] += SAVE_INTERVAL_S
    session.extend_reply(", world")
    # The app "crashes" here: no finish_reply. What a restart sees:
    reloaded = HistoryStore.open(store.path).load_session(session.id).messages[-1]
    assert reloaded.content == "Hello, world"
    assert reloaded.finish_reason == "interrupted"


def test_a_session_reaches_the_store_with_its_first_message(store) -> None:
    session = ChatSession(ChatSettings(), store)
    assert session.id is None and store.list_sessions() == []
    session.add_user("hi")
    assert session.id is not None
    assert [s.title for s in store.list_sessions()] == ["hi"]


def test_settings_changes_are_stored(store) -> None:
    session = ChatSession(ChatSettings(), store)
    session.add_user("hi")
    session.update_settings(ChatSettings(temperature=0.0, system_prompt="S"))
    saved = ChatSettings.from_json(store.load_session(session.id).settings, ChatSettings())
    assert saved.temperature == 0.0 and saved.system_prompt == "S"
