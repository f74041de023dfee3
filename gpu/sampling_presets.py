"""Named sampling settings, and the chat app's defaults among them, defined once.

The app's new chats start from `CHAT_DEFAULTS` and `tinychat bench --sampling chat` measures
the same values, so the setting people chat with is the one the benchmark reports. A preset
holds only how tokens are chosen; how many, and how outputs stream, are the caller's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpu.sampling_params import SamplingParams


@dataclass(frozen=True)
class SamplingPreset:
    """The token-choosing fields of SamplingParams, frozen (a preset is shared)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        """A fresh SamplingParams with these values; `overrides` sets any other field."""
        return SamplingParams(**{**asdict(self), **overrides})

    def describe(self) -> str:
        """The fields that differ from off, in words: "temperature 0.7, top-p 0.9"."""
        if self.temperature == 0:
            return "greedy"
        off = asdict(SamplingPreset())
        return ", ".join(
            f"{_LABELS[name]} {value:g}"
            for name, value in asdict(self).items()
            if name == "temperature" or value != off[name]
        )


_LABELS = {
    "temperature": "temperature",
    "top_p": "top-p",
    "top_k": "top-k",
    "min_p": "min-p",
    "repetition_penalty": "repetition penalty",
    "presence_penalty": "presence penalty",
    "frequency_penalty": "frequency penalty",
}


# What a new chat in the app samples with (the Ctrl+S dialog and the command line change it).
CHAT_DEFAULTS = SamplingPreset(temperature=0.7, top_p=0.9, repetition_penalty=1.1)
# The longest reply of a new chat, in tokens.
CHAT_MAX_TOKENS = 512


def chat_sampling_params(**overrides: Any) -> SamplingParams:
    """SamplingParams of the app's defaults (max_tokens included); `overrides` win."""
    return CHAT_DEFAULTS.sampling_params(**{"max_tokens": CHAT_MAX_TOKENS, **overrides})
