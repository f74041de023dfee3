"""generation_config.json -> `GenerationConfig`: the sampling defaults a model ships with.

Only the keys an engine acts on are kept. Everything is optional: a folder without the file, or a
key without a value, gives None (or an empty tuple), and the engine falls back to its own
defaults. `do_sample=false` is kept as is rather than folded into the temperature, so the engine
decides what it means (transformers then ignores temperature/top_p/top_k and decodes greedily).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import token_ids
from .errors import fail

FILENAME = "generation_config.json"


@dataclass
class GenerationConfig:
    """Sampling defaults from generation_config.json (None: the model states no preference)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    do_sample: bool | None = None

    @classmethod
    def from_folder(cls, folder: Path | str) -> GenerationConfig:
        """Read `folder/generation_config.json`; defaults when the file is absent."""
        path = Path(folder) / FILENAME
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise fail(path, f"not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise fail(path, "expected a JSON object")
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = FILENAME) -> GenerationConfig:
        """Build from a parsed generation_config.json dict."""

        def number(key: str, kind: type) -> Any:
            value = d.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise fail(source, f"{key} must be a non-negative number, got {value!r}")
            return kind(value)

        bos = d.get("bos_token_id")
        if bos is not None and (not isinstance(bos, int) or isinstance(bos, bool) or bos < 0):
            raise fail(source, f"bos_token_id must be a token id, got {bos!r}")
        do_sample = d.get("do_sample")
        return cls(
            temperature=number("temperature", float),
            top_p=number("top_p", float),
            top_k=number("top_k", int),
            repetition_penalty=number("repetition_penalty", float),
            max_new_tokens=number("max_new_tokens", int),
            eos_token_ids=token_ids(d.get("eos_token_id"), source, "eos_token_id"),
            bos_token_id=bos,
            do_sample=None if do_sample is None else bool(do_sample),
        )

    def to_dict(self) -> dict[str, Any]:
        """An HF generation_config.json (only the keys that are set)."""
        out: dict[str, Any] = {}
        if self.bos_token_id is not None:
            out["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            eos = list(self.eos_token_ids)
            out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
        for key in ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.max_new_tokens is not None:
            out["max_new_tokens"] = self.max_new_tokens
        return out
