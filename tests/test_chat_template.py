"""Chat templates rendered as transformers renders them, and where templates come from."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import tokenizers

from weights import ChatTemplateError, ModelLoadError, Tokenizer
from weights.random_model import byte_level_tokenizer
from weights.tokenizer import builtin_template


def make_tokenizer(template: str | None = None, specials=("<|im_start|>", "<|im_end|>")):
    return Tokenizer(
        byte_level_tokenizer(tuple(specials)),
        bos_token=specials[0],
        eos_token=specials[-1],
        chat_template=template,
    )


def render(template: str, messages=None, **kwargs) -> str:
    messages = messages or [{"role": "user", "content": "hi"}]
    return make_tokenizer(template).apply_chat_template(messages, tokenize=False, **kwargs)


def test_trim_and_lstrip_blocks() -> None:
    template = (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n"
        "{% endif %}\n{% endfor %}"
    )
    assert (
        render(template, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        == "[a]\n[b]\n"
    )


def test_tojson_keeps_unicode_and_html_and_supports_indent() -> None:
    data = {"text": "Zürich <b> & 'x'", "n": [1, 2]}
    assert render("{{ data | tojson }}", data=data) == json.dumps(data, ensure_ascii=False)
    assert render("{{ data | tojson(indent=2) }}", data=data) == json.dumps(
        data, ensure_ascii=False, indent=2
    )


def test_raise_exception_is_a_clear_error() -> None:
    template = (
        "{% if messages[0].role != 'system' %}{{ raise_exception('System first!') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="System first!") as info:
        render(template)
    assert isinstance(info.value, ModelLoadError) and "\n" not in str(info.value)


def test_strftime_now_and_llama3_default_date() -> None:
    assert render("{{ strftime_now('%Y') }}") == str(datetime.now().year)
    text = render(builtin_template("llama3"))
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}\n" in text
    assert "Today Date: 02 Jan 2025\n" in render(
        builtin_template("llama3"), date_string="02 Jan 2025"
    )


def test_special_token_variables_and_extra_kwargs() -> None:
    template = "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ custom }}|{{ tools }}"
    assert render(template, custom=42) == "<|im_start|>|<|im_end|>|False|42|None"
    assert render(template, bos_token="X", custom=1).startswith("X|")  # kwargs win


def test_none_valued_message_keys_are_dropped() -> None:
    template = "{% for m in messages %}{{ 'content' in m }}{% endfor %}"
    assert render(template, [{"role": "assistant", "content": None}]) == "False"


def test_loopcontrols_extension() -> None:
    template = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    assert (
        render(template, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        == "a"
    )


def test_sandbox_blocks_escapes() -> None:
    with pytest.raises(ChatTemplateError):
        render("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        render("{{ messages.append(1) }}")  # immutable sandbox


def test_empty_conversation() -> None:
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        make_tokenizer().apply_chat_template([])


def test_tokenize_encodes_without_adding_special_tokens() -> None:
    tok = make_tokenizer()
    messages = [{"role": "user", "content": "héllo"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == "<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(messages) == tok.encode(text, add_special_tokens=False)
    assert tok.apply_chat_template(messages)[0] == tok.token_to_id("<|im_start|>")
    no_prompt = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert no_prompt == "<|im_start|>user\nhéllo<|im_end|>\n"


def test_builtin_template_choice() -> None:
    assert make_tokenizer().chat_template == builtin_template("chatml")
    llama = make_tokenizer(
        specials=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
    )
    assert llama.chat_template == builtin_template("llama3")
    text = llama.apply_chat_template(
        [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"}],
        tokenize=False,
        date_string="26 Jul 2024",
    )
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def write_folder(folder: Path, config: dict, template_file: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if template_file is not None:
        (folder / "chat_template.jinja").write_text(template_file)
    return folder


def test_template_sources_in_a_folder(tmp_path: Path) -> None:
    plain = write_folder(tmp_path / "a", {"chat_template": "A{{ messages[0].content }}"})
    assert render_folder(plain) == "Ahi"
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    assert render_folder(write_folder(tmp_path / "b", {"chat_template": named})) == "D"
    with_file = write_folder(tmp_path / "c", {"chat_template": "A"}, template_file="F")
    assert render_folder(with_file) == "F"  # chat_template.jinja wins, as in transformers
    assert Tokenizer.from_folder(
        write_folder(tmp_path / "d", {})
    ).chat_template == builtin_template("chatml")


def render_folder(folder: Path) -> str:
    return Tokenizer.from_folder(folder).apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )


def test_special_tokens_as_added_token_dicts(tmp_path: Path) -> None:
    config = {
        "bos_token": {"content": "<|im_start|>", "lstrip": False, "normalized": False},
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>"},
    }
    tok = Tokenizer.from_folder(write_folder(tmp_path / "t", config))
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (tok.bos_token_id, tok.eos_token_id) == (257, 258)


def test_broken_template_fails_at_load_naming_the_file(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "t", {"chat_template": "{% for m in messages %}"})
    with pytest.raises(
        ModelLoadError, match="tokenizer_config.json: chat template does not compile"
    ):
        Tokenizer.from_folder(folder)
    folder = write_folder(tmp_path / "u", {"chat_template": 5})
    with pytest.raises(ModelLoadError, match="chat_template must be a string"):
        Tokenizer.from_folder(folder)


def test_tokenizer_without_config_file(tmp_path: Path) -> None:
    tokenizers_tok = byte_level_tokenizer()
    tokenizers_tok.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_folder(tmp_path)
    assert tok.bos_token is None and tok.eos_token_id is None
    assert isinstance(tok.backend, tokenizers.Tokenizer) and tok.vocab_size == 259
