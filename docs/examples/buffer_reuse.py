"""Buffer reuse: every step of the forward writes into the same memory.

LlamaModel allocates its intermediates once, sized for the largest step (max_num_batched_tokens
rows, max_num_seqs rows of logits), and a step of T tokens uses the first T rows of each
(gpu/model.py: LlamaModel.__init__ and LlamaModel.forward). Nothing is allocated while a step
runs. On the GPU that is what lets a step be captured into a CUDA graph and replayed: a graph
replays fixed kernels on fixed addresses, so the inputs too live in fixed device buffers that
the host refills before each replay (gpu/backends/cuda/executor.py: StepInputs).

The script runs prefill and decode steps of different sizes through the engine on the numpy
backend, records the address of every buffer the forward wrote and of the logits it returned,
and checks that each is one address for the whole run.

    python docs/examples/buffer_reuse.py
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from tiny_model import tiny_engine

from gpu.sampling_params import SamplingParams

BUFFERS = ("residual", "normed", "qkv", "attn_out", "gate_up", "mlp_act", "logits")


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def main() -> None:
    engine = tiny_engine(max_num_seqs=4)
    model = engine.runner.executor.model
    seen: dict[str, set[int]] = defaultdict(set)
    step_sizes: list[int] = []
    forward = model.forward

    def recording_forward(batch, num_logits):
        logits = forward(batch, num_logits)
        step_sizes.append(batch.num_tokens)
        seen["returned logits"].add(address(logits))
        for name in BUFFERS:
            seen[name].add(address(getattr(model, name)))
        return logits

    model.forward = recording_forward
    rng = np.random.default_rng(0)
    for n in (3, 9, 17, 30):  # prompts of different lengths, replies of different lengths
        prompt = [int(t) for t in rng.integers(0, 300, size=n)]
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()

    assert all(len(addresses) == 1 for addresses in seen.values()), seen
    assert seen["returned logits"] == seen["logits"]  # the first rows of the one buffer
    print(f"{len(step_sizes)} steps of {min(step_sizes)} to {max(step_sizes)} tokens;")
    for name, addresses in seen.items():
        print(f"  {name:16s} always at {next(iter(addresses)):#x}")


if __name__ == "__main__":
    main()
