"""The tokenizer: tokenizer.json through the `tokenizers` library, plus the chat template.

`tokenizers` (the Rust library behind transformers' fast tokenizers) does the real work; this
class adds what lives in the other files of a model folder: which tokens are BOS/EOS
(tokenizer_config.json, where they may be plain strings or AddedToken dicts), the chat template
(chat_template.jinja, or tokenizer_config.json's `chat_template`, a string or a list of named
templates) and a built-in template for folders that carry none.

Two transformers behaviours are copied on purpose: `apply_chat_template(tokenize=True)` encodes
the rendered text with `add_special_tokens=False` (the template already wrote BOS), and
`add_special_tokens=True` means whatever tokenizer.json's post-processor adds (transformers 5
ignores tokenizer_config's `add_bos_token` when tokenizer.json exists). Decoding never applies
the legacy `clean_up_tokenization_spaces` heuristic, which mangles text such as "a . b".
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import tokenizers

from . import chat_template as chat_template_module
from .errors import fail

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"


def builtin_template(name: str) -> str:
    """The text of a template shipped in weights/templates/ ("llama3" or "chatml")."""
    return resources.files("weights").joinpath(f"templates/{name}.jinja").read_text("utf-8")


class Tokenizer:
    """Text <-> token ids for one model, and its chat template."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        unk_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        add_bos_token: bool | None = None,
        source: str = "tokenizer",
    ) -> None:
        self.backend = backend
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self.unk_token, self.pad_token = unk_token, pad_token
        self.add_bos_token = add_bos_token
        for kind, token in (("bos", bos_token), ("eos", eos_token)):
            if token is not None and backend.token_to_id(token) is None:
                raise fail(source, f"{kind}_token {token!r} is not in the vocabulary")
        if chat_template is None:
            # Llama 3 vocabularies carry its header tokens; anything else gets ChatML.
            llama3 = backend.token_to_id("<|start_header_id|>") is not None
            chat_template = builtin_template("llama3" if llama3 else "chatml")
        try:
            chat_template_module.compile_template(chat_template)  # fail now, not mid-chat
        except chat_template_module.ChatTemplateError as exc:
            raise fail(source, str(exc)) from None
        self.chat_template: str = chat_template
        added = backend.get_added_tokens_decoder()
        self._vocab_size = max(
            backend.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1
        )
        specials = {i for i, tok in added.items() if tok.special}
        named = (bos_token, eos_token, unk_token, pad_token)
        specials |= {backend.token_to_id(t) for t in named if t is not None} - {None}
        self.all_special_ids: set[int] = specials

    @classmethod
    def from_folder(cls, folder: Path | str) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json and chat_template.jinja from a folder."""
        folder = Path(folder)
        path = folder / TOKENIZER_FILE
        if not path.is_file():
            raise fail(folder, f"no {TOKENIZER_FILE} (tinychat needs the fast-tokenizer file)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            why = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise fail(path, f"not a valid tokenizer file ({why})") from None

        config: dict[str, Any] = {}
        config_path = folder / CONFIG_FILE
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise fail(config_path, f"not valid JSON ({exc})") from None
            if not isinstance(config, dict):
                raise fail(config_path, "expected a JSON object")

        template = _pick_template(config.get("chat_template"), config_path)
        template_path = folder / TEMPLATE_FILE
        if template_path.is_file():  # takes priority, as in transformers
            template = template_path.read_text(encoding="utf-8")
            try:
                chat_template_module.compile_template(template)
            except chat_template_module.ChatTemplateError as exc:
                raise fail(template_path, str(exc)) from None
        return cls(
            backend,
            bos_token=_token_text(config.get("bos_token"), config_path),
            eos_token=_token_text(config.get("eos_token"), config_path),
            unk_token=_token_text(config.get("unk_token"), config_path),
            pad_token=_token_text(config.get("pad_token"), config_path),
            chat_template=template,
            add_bos_token=config.get("add_bos_token"),
            source=str(config_path if config else path),
        )

    # -- vocabulary ------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (base vocabulary plus added tokens)."""
        return self._vocab_size

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.backend.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.backend.token_to_id(self.eos_token)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    # -- text <-> ids ----------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in the text become their ids."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids` (special tokens left out unless asked for)."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        **extra: Any,
    ) -> list[int] | str:
        """The prompt for a conversation: rendered text, or its ids when `tokenize`."""
        specials = {
            name: value
            for name, value in (
                ("bos_token", self.bos_token),
                ("eos_token", self.eos_token),
                ("unk_token", self.unk_token),
                ("pad_token", self.pad_token),
            )
            if value is not None
        }
        text = chat_template_module.render(
            self.chat_template, messages, add_generation_prompt, specials, **extra
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _token_text(value: Any, source: Path) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise fail(source, f"cannot read special token {value!r}")


def _pick_template(value: Any, source: Path) -> str | None:
    """tokenizer_config's chat_template: a string, or [{"name", "template"}] (take "default")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) for t in value) and value:
        named = {t.get("name"): t.get("template") for t in value}
        template = named.get("default", value[0].get("template"))
        if isinstance(template, str):
            return template
    raise fail(source, "chat_template must be a string or a list of {name, template}")
