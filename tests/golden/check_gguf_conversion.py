"""DEV ONLY: prove the GGUF converter against transformers' own GGUF loader.

transformers can load SmolLM2's GGUF directly (dequantizing it, un-permuting q/k itself). Our
converted folder must give the same logits once transformers' weights are rounded to bf16 like
ours: any mistake in tensor names, the q/k un-permutation, dequantization or the config would
show as a difference. Not run by CI (it needs torch + transformers + accelerate).

    /tmp/devvenv/bin/python tests/golden/check_gguf_conversion.py CONVERTED_DIR GGUF_FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(converted: Path, gguf: Path) -> int:
    ours = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    tok = AutoTokenizer.from_pretrained(converted)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    x = torch.tensor([ids])
    with torch.no_grad():
        diff = (ours(x).logits - theirs(x).logits).abs().max().item()
        reply = ours.generate(x, max_new_tokens=12, do_sample=False)[0, len(ids) :]
    print(f"max |logit difference| = {diff}; greedy reply: {tok.decode(reply)!r}")
    return 0 if diff == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
