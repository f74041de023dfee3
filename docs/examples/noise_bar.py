"""Why the sampler's bar is the block's best noisy scores, not each warp's: a model of the loop.

The scores pass (gpu/kernels/sampling_scores.py) draws a Gumbel-max over each row: x + g for
every score, g = -log(-log(u)). The two logarithms are skipped for a score that provably stays
under a bar, a noisy score the row already holds n times (n = 1 for a temperature row, 3 for
a top-p row, which keeps its three best). A score that may pass sends its lane down the slow
path, and the warp's other 31 lanes wait for it: what the loop pays is the warp steps in which
any lane passed, not the passes. How often that happens depends on the bar:

- warp: each lane keeps its own best n, and the bar is the warp's max of its lanes' n-th best
  (what the kernels did before: one shuffle reduction a group).
- block: the block keeps its best n in shared memory, each score that passes inserted there,
  and the bar is the block's n-th best (sampling_common.insert_best, shared_offset).

This models one block's share of a flat row at batch 256 (64,128 logits of std 1.3, as a
Llama-3.2-1B row with random weights: 128,256 over two blocks), 256 threads, four scores a
thread a group, the bar refreshed once a group, and counts the warp steps with a pass. The
first group has no bar: every score passes there, in every mode.

    python docs/examples/noise_bar.py
"""

from __future__ import annotations

import numpy as np

THREADS, UNROLL, WARP = 256, 4, 32
SHARE = 64_128  # a block's share of a 128,256-logit row at batch 256 (two blocks a row)


def warp_steps_with_a_pass(noisy: np.ndarray, n: int, bar_of: str) -> float:
    """The fraction of warp steps (one score a lane) where some lane's noisy score passed its
    bar, for a bar made the `bar_of` way ("warp" or "block") from the best n so far."""
    groups = len(noisy) // (THREADS * UNROLL)
    scores = noisy[: groups * THREADS * UNROLL].reshape(groups, UNROLL, THREADS)
    own = np.full((THREADS, n), -np.inf)  # each thread's best n, best first
    block = np.full(n, -np.inf)  # the block's best n
    bar = np.full(THREADS, -np.inf)  # no bar before the first group's end
    steps = 0
    for group in scores:
        passed = group > bar  # [UNROLL, THREADS]
        steps += int(passed.reshape(UNROLL, THREADS // WARP, WARP).any(axis=2).sum())
        offered = np.where(passed, group, -np.inf)
        own = -np.sort(-np.concatenate([own, offered.T], axis=1), axis=1)[:, :n]
        block = -np.sort(-np.concatenate([block, offered.ravel()]))[:n]
        if bar_of == "warp":
            bar = np.repeat(own[:, n - 1].reshape(-1, WARP).max(axis=1), WARP)
        else:
            bar = np.full(THREADS, block[n - 1])
    return steps / (groups * UNROLL * THREADS // WARP)


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.3, SHARE)
    noisy = x - np.log(-np.log(rng.random(SHARE)))
    rates = {
        (n, bar_of): warp_steps_with_a_pass(noisy, n, bar_of)
        for n in (1, 3)
        for bar_of in ("warp", "block")
    }
    for (n, bar_of), rate in rates.items():
        kind = "top-p (three best)" if n == 3 else "temperature (the best)"
        print(f"{kind:24s} bar from the {bar_of:5s}: {rate:6.1%} of warp steps take the noise")
    # The three best of each lane are a poor bar: a lane has seen few scores.
    assert rates[3, "warp"] > 0.15 and rates[3, "block"] < 0.05
    assert rates[1, "block"] < rates[1, "warp"] < rates[3, "warp"]


if __name__ == "__main__":
    main()
