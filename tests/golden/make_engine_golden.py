"""DEV-ONLY: make the golden data the engine tests compare against, with HF transformers.

Not part of the product or of CI (it needs torch and transformers); run it once, by hand, and
commit what it writes:

    TINYCHAT_HOME=... python -m chat_app.cli pull        # the converted default model
    /path/to/venv-with-torch/bin/python tests/golden/make_engine_golden.py MODEL_FOLDER

It writes
- engine_golden.json: for chat prompts on the converted default model, the prompt ids
  (transformers' chat template + tokenizer) and 32 greedy ids from a plain argmax loop over
  transformers' float32 logits (not `generate`, whose min_new_tokens masks EOS), with the gap
  between the top two logits at every step, so a test can stop comparing at the first step
  where a float32 reordering could flip the choice.
- llama32_random_golden.npz: a Llama-3.2-1B-shaped model (2 layers, 128,256-token vocabulary,
  llama3 rope scaling, tied embeddings) with the random weights of
  gpu.model_weights.random_hf_tensors(seed=0): transformers' logits at fixed vocabulary ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent))

from gpu.model_weights import random_hf_tensors  # noqa: E402
from gpu.presets import PRESETS, preset_config  # noqa: E402

LONG_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden press adapted from "
    "those used to make wine. Before him, books were copied by hand, mostly in monasteries, "
    "and a single Bible could take a scribe years to finish. "
)
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are a terse assistant who answers in one sentence."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "Seven is a prime number."},
        {"role": "user", "content": "And an even one?"},
    ],
    [{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
    [{"role": "user", "content": "Summarise this text in one sentence:\n\n" + LONG_TEXT * 7}],
    [{"role": "user", "content": "Translate 'good morning' into German and Japanese. 🙂"}],
]
NEW_TOKENS = 32


@torch.no_grad()
def greedy(model, ids: list[int]) -> tuple[list[int], list[float]]:
    """Argmax loop over float32 logits; returns the ids and the top-2 gap of each step."""
    out, gaps = [], []
    x = torch.tensor([ids])
    past = None
    for _ in range(NEW_TOKENS):
        result = model(input_ids=x, past_key_values=past, use_cache=True)
        past = result.past_key_values
        logits = result.logits[0, -1].float()
        top2 = torch.topk(logits, 2)
        out.append(int(top2.indices[0]))
        gaps.append(float(top2.values[0] - top2.values[1]))
        x = top2.indices[:1].view(1, 1)
    return out, gaps


def chat_golden(folder: Path) -> None:
    tok = AutoTokenizer.from_pretrained(folder)
    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    cases = []
    for messages in CHATS:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        output, gaps = greedy(model, ids)
        cases.append({"messages": messages, "prompt_ids": ids, "output_ids": output, "gaps": gaps})
        print(len(ids), "prompt tokens ->", repr(tok.decode(output)), f"min gap {min(gaps):.4f}")
    (HERE / "engine_golden.json").write_text(
        json.dumps({"model": folder.name, "new_tokens": NEW_TOKENS, "cases": cases}, indent=1)
    )


@torch.no_grad()
def llama32_golden() -> None:
    hf = dict(PRESETS["llama-3.2-1b"], num_hidden_layers=2)
    config = LlamaConfig(**{k: v for k, v in hf.items() if k != "architectures"})

    tensors = random_hf_tensors(preset_config("llama-3.2-1b", num_hidden_layers=2), seed=0)
    model = LlamaForCausalLM(config).float().eval()
    state = {k: torch.from_numpy(v) for k, v in tensors.items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, hf["vocab_size"], 24).tolist()
    positions = [0, 5, 17, 23]
    vocab_ids = np.sort(rng.choice(hf["vocab_size"], 4096, replace=False))
    logits = model(input_ids=torch.tensor([tokens])).logits[0].float().numpy()
    np.savez_compressed(
        HERE / "llama32_random_golden.npz",
        tokens=np.array(tokens, np.int64),
        positions=np.array(positions),
        vocab_ids=vocab_ids,
        logits=logits[positions][:, vocab_ids],
        argmax=logits.argmax(-1),
    )
    print("llama-3.2-1b (2 layers) logits saved; argmax", logits.argmax(-1)[:8])


if __name__ == "__main__":
    torch.manual_seed(0)
    chat_golden(Path(sys.argv[1]))
    llama32_golden()
