"""A compile worker of gpu/backends/cuda/precompile.py, run as
`python -m gpu.backends.cuda.compile_worker`.

It reads pickled tasks (index, pickled kernel dispatcher, argument types) from stdin until it
closes and answers each, in order, with a pickled (index, pickled compiled kernel or None,
error or None) on stdout. It never writes the disk cache (the parent does, so that no two
processes write one kernel's index file); anything else it prints goes to stderr.
"""

from __future__ import annotations

import os
import pickle
import sys


def main() -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints (Numba's warnings, C libraries) must not mix with replies
    sys.stdout = sys.stderr
    tasks = sys.stdin.buffer
    dispatchers: dict[bytes, object] = {}
    while True:
        try:
            index, blob, argtypes = pickle.load(tasks)
        except EOFError:
            return
        try:
            dispatcher = dispatchers.get(blob)
            if dispatcher is None:
                dispatcher = dispatchers[blob] = pickle.loads(blob)
            kernel = dispatcher.compile(argtypes)
            reply = (index, pickle.dumps(kernel, protocol=pickle.HIGHEST_PROTOCOL), None)
        except Exception as exc:  # the parent compiles this one itself
            reply = (index, None, f"{type(exc).__name__}: {exc}")
        pickle.dump(reply, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()


if __name__ == "__main__":
    main()
