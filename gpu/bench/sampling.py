"""`--sampling`: which sampling settings the latency and decode workloads run.

Each setting is one row per batch, named in the table and the JSON, and each non-greedy row is
set beside the greedy row of the same batch in the same run (the target is >= 0.95x): the
app's own defaults ("chat") must decode about as fast as greedy, or the benchmark measures a
path nobody chats on.
"""

from __future__ import annotations

from dataclasses import replace

from gpu.sampling_params import RequestOutputKind, SamplingParams
from gpu.sampling_presets import CHAT_DEFAULTS, SamplingPreset

_SAMPLED = SamplingPreset(temperature=0.7)

SETTINGS: dict[str, SamplingPreset] = {
    "greedy": SamplingPreset(temperature=0.0),
    "temperature": _SAMPLED,
    "top-k": replace(_SAMPLED, top_k=50),
    "top-p": replace(_SAMPLED, top_p=0.9),
    "min-p": replace(_SAMPLED, min_p=0.05),
    "chat": CHAT_DEFAULTS,
    "penalties": replace(CHAT_DEFAULTS, presence_penalty=0.5, frequency_penalty=0.5),
}
GROUPS = {"all": list(SETTINGS)}
DEFAULT = "greedy,chat"


def parse_sampling(text: str) -> list[str]:
    """Names like "greedy,chat" or "all" -> setting names, in SETTINGS order (ValueError:
    an unknown name)."""
    names: set[str] = set()
    for word in (w.strip() for w in text.split(",")):
        if word in GROUPS:
            names.update(GROUPS[word])
        elif word in SETTINGS:
            names.add(word)
        elif word:
            choices = ", ".join([*SETTINGS, *GROUPS])
            raise ValueError(f"unknown sampling setting {word!r}: use any of {choices}")
    if not names:
        raise ValueError("--sampling names no setting")
    return [name for name in SETTINGS if name in names]


def bench_params(name: str, max_tokens: int, seed: int) -> SamplingParams:
    """A benchmark request: exactly `max_tokens` tokens, no text, seeded (reproducible runs)."""
    return SETTINGS[name].sampling_params(
        max_tokens=max_tokens,
        ignore_eos=True,
        detokenize=False,
        seed=seed,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def add_ratios(rows: list[dict]) -> None:
    """Set each row's `vs_greedy`: its tok/s over the greedy row's of the same batch (None
    where greedy did not run)."""
    greedy = {r["batch_size"]: r["decode_tok_s"] for r in rows if r["sampling"] == "greedy"}
    for r in rows:
        base = greedy.get(r["batch_size"])
        r["vs_greedy"] = r["decode_tok_s"] / base if base else None
