"""CUDA graphs: a whole step recorded once, replayed for ~1.3 us a kernel.

A Llama-3.2-1B decode step is ~200 launches. From Python each costs 30-75 us (Numba's argument
handling), so launched one by one the step is launch-bound at ~9 ms while the GPU work is under
2 ms. Recorded into a graph, the same launches replay from the driver with no Python at all.

Capture is stream capture: between cuStreamBeginCapture and cuStreamEndCapture on the backend's
stream, every kernel launch and cuBLAS call is recorded instead of run (the capture mode is
thread-local, so the engine thread's capture never trips over another thread's CUDA calls).
What a graph records is fixed: kernel arguments, pointers, grid sizes. So a graph is valid only
for one batch size (its bucket) and only because every per-step input lives at a fixed device
address (the executor's staged buffers) and every per-step shape is read from device memory.
Steps smaller than a bucket are padded to it (padding rows: no KV write, seq_len 0). Decode
steps are keyed by their batch size; prefill and mixed steps by (tokens, sequences), both
rounded up to a bucket: their attention reads every length from device memory too, and the
launch's query-length bound is the token bucket, whose surplus query tiles exit at once.

The driver calls go through cuda.bindings on the stream handle Numba owns.
"""

from __future__ import annotations

from collections.abc import Callable

from cuda.bindings import driver as drv


def _check(result) -> tuple:
    """cuda.bindings returns (CUresult, *values): raise on an error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        raise RuntimeError(f"CUDA graph call failed: {name.decode() if name else err}")
    return tuple(values)


def capture_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, 16, then every 16 up to max_num_seqs."""
    buckets = [b for b in (1, 2, 4, 8, 16) if b < max_num_seqs]
    buckets += list(range(16, max_num_seqs, 16))
    buckets.append(max_num_seqs)
    return sorted(set(buckets))


def token_buckets(max_num_tokens: int) -> list[int]:
    """Token counts that get a graph for prefill and mixed steps: powers of two from 16 to 512,
    then every 512 up to max_num_tokens (padding wastes at most half of a small step's rows and
    an eighth of a large one's; the matrix products are what padding costs)."""
    buckets = [b for b in (16, 32, 64, 128, 256, 512) if b < max_num_tokens]
    buckets += list(range(512, max_num_tokens, 512))
    buckets.append(max_num_tokens)
    return sorted(set(buckets))


def bucket_for(batch_size: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds batch_size (None: too large for any graph)."""
    for b in buckets:
        if b >= batch_size:
            return b
    return None


class CudaGraph:
    """One recorded step: `CudaGraph(stream, fn)` captures fn's launches; `replay()` runs them."""

    def __init__(self, stream, record: Callable[[], None]) -> None:
        self.stream = drv.CUstream(int(stream.handle))
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(drv.cuStreamBeginCapture(self.stream, mode))
        try:
            record()
        finally:
            (graph,) = _check(drv.cuStreamEndCapture(self.stream))
        self.graph = graph
        (self.exec,) = _check(drv.cuGraphInstantiate(graph, 0))

    def replay(self) -> None:
        _check(drv.cuGraphLaunch(self.exec, self.stream))

    def __del__(self) -> None:
        try:
            drv.cuGraphExecDestroy(self.exec)
            drv.cuGraphDestroy(self.graph)
        except Exception:
            pass
