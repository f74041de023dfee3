"""The app process's garbage collector, tuned so that its pauses fit between frames.

Textual's frames make cyclic garbage (a strip cropped to itself caches itself; a Markdown
append parses new blocks and merges one away): a 4-second stream of 2,048 tokens left 70,000
(one tab) to 83,000 (eight) unreachable objects that only the collector frees. With Python's
default thresholds (700, 10, 10) that was ~110 young collections a run of 8 tabs x 512
tokens on the synthetic core, ~10 middle ones and one full one, which walks the whole heap
(~140,000 objects: Textual, the tokenizer, every tab's widgets) in 58-92 ms on the 2-core
CPU: three frames, and the longest gap between tokens of the run.

So, as vLLM does in its front-end process, the heap that start-up built (modules, the
tokenizer, the first screen) is collected once and frozen (`gc.freeze`): no collection walks
it again (nor frees it: a tab open at start-up and closed later keeps its widgets). And a
young collection waits for YOUNG_THRESHOLD new objects instead of 700: the same runs made 6-8
of them and no older pass, 17-23 ms of collecting a run against 85-119.
`tinychat bench app --runs synthetic,app-synthetic --new-tokens 512`, 4 runs each, alternating,
load 2.9-3.8: p99 gap with 8 tabs 50-98 ms against 95-184, with 1 tab 44-62 against 51-84.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
_frozen = False


def tune_gc_for_frames() -> None:
    """Raise the young generation's threshold and, the first time in this process, collect
    and freeze the heap that exists now: call it once the app is up (its engine loaded)."""
    global _frozen
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()
