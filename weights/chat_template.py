"""Rendering chat templates exactly as Hugging Face transformers does.

A chat template is a Jinja program shipped with the model that turns a list of messages into the
prompt text the model was trained on. Any difference from transformers' rendering (one newline,
one missing BOS) silently changes what the model sees, so the environment here copies
transformers': a sandbox (templates come from the internet), `trim_blocks` + `lstrip_blocks`, the
`loopcontrols` extension, a `tojson` that keeps non-ASCII text, `raise_exception` and
`strftime_now` globals, and the same variables: `messages`, `tools`, `documents`,
`add_generation_prompt`, the special tokens, plus whatever the caller adds (e.g. `date_string`).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ModelLoadError


class ChatTemplateError(ModelLoadError):
    """The template refused the conversation (its `raise_exception`) or failed to render."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters (<, >, &, '), which is wrong for prompts.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile once per distinct template text (a chat re-renders on every turn)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from None


def render(
    template: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    special_tokens: dict[str, str],
    **extra: Any,
) -> str:
    """Render `messages`; `extra` variables override the special tokens, as in transformers."""
    if not messages:
        raise ChatTemplateError("cannot apply a chat template to an empty conversation")
    # transformers drops keys whose value is None (OpenAI-style `content=None`) before rendering.
    clean = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
    variables = {"tools": None, "documents": None, **special_tokens, **extra}
    try:
        return compile_template(template).render(
            messages=clean, add_generation_prompt=add_generation_prompt, **variables
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template error: {exc}") from None
