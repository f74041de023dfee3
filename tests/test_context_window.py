"""A chat that outgrows the context drops its oldest turns from the prompt and goes on.

The fitting itself (chat_app/context_window.py) on a one-token-per-character tokenizer, then
the tab on the fake engine with a tiny context: it keeps answering, the prompt keeps the system
prompt and the newest message, the history keeps every turn, and a quiet notice says so.
"""

from __future__ import annotations

from pathlib import Path

from app_doubles import FakeEngine, FakeTokenizer, async_test, fake_app, paste_text, wait_until

from chat_app.context_window import Chat, fit_chat, reply_room
from chat_app.session import ChatSettings
from chat_app.widgets.messages import Notice

TOKENIZER = FakeTokenizer()


def encode(chat: Chat) -> list[int]:
    return TOKENIZER.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)


def chat_of(turns: int, system: str | None = "Be brief.") -> Chat:
    chat = [{"role": "system", "content": system}] if system else []
    for i in range(turns):
        chat.append({"role": "user", "content": f"question {i} " + "x" * 40})
        chat.append({"role": "assistant", "content": f"answer {i} " + "y" * 40})
    chat.append({"role": "user", "content": "the newest question"})
    return chat


def test_reply_room_is_a_quarter_of_a_small_context_and_256_of_a_large_one() -> None:
    assert reply_room(512) == 128
    assert reply_room(1024) == 256
    assert reply_room(8192) == 256


def test_a_chat_that_fits_goes_out_whole() -> None:
    chat = chat_of(2)
    fitted = fit_chat(chat, encode, 4096)
    assert fitted.messages == chat and fitted.dropped_turns == 0
    assert fitted.prompt_ids == encode(chat)


def test_the_fewest_oldest_turns_are_dropped_keeping_the_system_prompt_and_newest_message() -> None:
    chat = chat_of(30)
    max_model_len = 1000
    fitted = fit_chat(chat, encode, max_model_len)
    limit = max_model_len - reply_room(max_model_len)
    assert 0 < fitted.dropped_turns < 30
    assert len(fitted.prompt_ids) <= limit
    assert fitted.prompt_ids == encode(fitted.messages)
    assert fitted.messages[0] == chat[0]  # the system prompt
    assert fitted.messages[-1] == chat[-1]  # the newest user message
    assert fitted.messages[1]["role"] == "user"  # whole turns go
    assert fitted.messages[1:] == chat[1 + 2 * fitted.dropped_turns :]
    # One turn fewer dropped would not fit: no more was dropped than needed.
    one_less = chat[:1] + chat[1 + 2 * (fitted.dropped_turns - 1) :]
    assert len(encode(one_less)) > limit


def test_without_a_system_prompt_the_prompt_starts_at_a_user_turn() -> None:
    chat = chat_of(30, system=None)
    fitted = fit_chat(chat, encode, 600)
    assert fitted.dropped_turns > 0
    assert fitted.messages[0]["role"] == "user"
    assert fitted.messages == chat[2 * fitted.dropped_turns :]


def test_when_even_the_newest_message_does_not_fit_only_it_and_the_system_prompt_go() -> None:
    chat = chat_of(3)
    chat[-1]["content"] = "z" * 2000
    fitted = fit_chat(chat, encode, 1000)
    assert fitted.dropped_turns == 3
    assert fitted.messages == [chat[0], chat[-1]]  # the engine refuses this with its own error


SIZE = (100, 32)


@async_test
async def test_a_tab_with_a_tiny_context_keeps_answering_after_many_turns(tmp_path: Path) -> None:
    engine = FakeEngine(max_model_len=400, reply_words=6)
    app, thread = fake_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        pane = app.chat_screen.active_pane
        pane.session.update_settings(ChatSettings(system_prompt="Be terse."))
        turns = 8
        for i in range(turns):
            await paste_text(pilot, f"message number {i} with some padding words")
            await pilot.press("enter")
            await wait_until(
                pilot,
                lambda i=i: not pane.replying and len(pane.session.messages) == 2 * (i + 1),
                f"reply {i}",
            )
        messages = pane.session.messages
        assert [m.finish_reason for m in messages if m.role == "assistant"] == ["stop"] * turns
        assert all(m.error is None for m in messages)
        # The last prompt: the system prompt first, the newest message last, the oldest gone.
        prompt = thread.engine.requests[-1][1]
        assert prompt.startswith("<|im_start|>system\nBe terse.<|im_end|>")
        assert prompt.endswith(
            "<|im_start|>user\nmessage number 7 with some padding words<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        assert "message number 0 " not in prompt
        assert len(prompt) <= 400 - reply_room(400)
        # Every turn stays in the session and in the history.
        assert len(messages) == 2 * turns
        (saved,) = app.store.list_sessions()
        record = app.store.load_session(saved.id)
        assert record is not None and len(record.messages) == 2 * turns
        # A quiet marker (not an error) says that earlier turns are out of the model's view.
        notices = [n for n in pane.query(Notice) if "out of the model's view" in str(n.render())]
        assert notices and not any(n.has_class("error") for n in notices)
