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

Programmatic dependent launch (gpu/kernels/pdl.py). Stream capture records a chain of plain
edges: each kernel starts only once the one before has completed. After capture, every edge from
a kernel into one of gpu/kernels' kernels (all of which wait for their predecessor with
griddepcontrol.wait before touching its output) becomes a programmatic edge on the
LAUNCH_ORDER port, so that kernel's blocks are launched as soon as every block of its
predecessor has started. Edges into cuBLAS's kernels, which do not wait, and into memory copies
stay as captured.

Only graphs of steps of at most PDL_MAX_TOKENS = 8 tokens get them: the steps whose products are
our kernels (gemv.py at one token, gemv_mma.py at 2-8), whose weights can stream while the
kernel before them drains. Measured on the H200 (`tinychat bench`): a batch-1 step of ~85
latency-bound kernels went from 997 to 933 us of GPU span (Llama-3.2-1B: 968 -> 1,022 tok/s;
SmolLM2-135M: 1,286 -> 1,405); with gemv_mma at 2, 4 and 8 tokens, SmolLM2-135M 2,075 / 4,105 /
8,239 -> 2,636 / 5,168 / 9,969 tok/s. Larger steps keep plain edges: where cuBLAS's products
fill the GPU our kernels' early blocks only wait beside them (batch 8 with cuBLAS: 6,658 ->
6,447 tok/s; batch 256: 100,715 -> 95,970).

The driver calls go through cuda.bindings on the stream handle Numba owns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from cuda.bindings import driver as drv

PDL_MAX_TOKENS = 8  # the largest step whose graph gets programmatic edges
# Numba mangles a kernel's qualified name: gpu.kernels.<module>.<function> begins like this.
OUR_KERNEL_PREFIX = b"_ZN3gpu7kernels"


def _check(result) -> tuple:
    """cuda.bindings returns (CUresult, *values): raise on an error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        raise RuntimeError(f"CUDA graph call failed: {name.decode() if name else err}")
    return tuple(values)


def pays_to_overlap(num_tokens: int) -> bool:
    """Whether a step of num_tokens tokens gets programmatic edges (PDL_MAX_TOKENS)."""
    return num_tokens <= PDL_MAX_TOKENS


@functools.cache
def device_supports_pdl() -> bool:
    """Programmatic edges need a Hopper or newer GPU (the kernels' wait is compiled in only for
    sm_90+, pdl.py) and a CUDA 12.3+ driver (edge data in graphs). An optimisation only: if
    the driver or the bindings cannot say, the graphs keep their captured edges."""
    try:
        (version,) = _check(drv.cuDriverGetVersion())
        (device,) = _check(drv.cuCtxGetDevice())
        major_attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        (major,) = _check(drv.cuDeviceGetAttribute(major_attr, device))
    except (RuntimeError, TypeError, AttributeError):
        return False
    return version >= 12030 and major >= 9


def waits_for_predecessor(kernel_name: bytes) -> bool:
    """Whether a kernel of this name is one of gpu/kernels' (they all call
    grid_dependency_sync before reading what an earlier kernel wrote)."""
    return kernel_name.startswith(OUR_KERNEL_PREFIX)


def _kernel_name(node) -> bytes | None:
    """The function name of a kernel node (None for any other node)."""
    (kind,) = _check(drv.cuGraphNodeGetType(node))
    if kind != drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
        return None
    (params,) = _check(drv.cuGraphKernelNodeGetParams(node))
    err, name = drv.cuFuncGetName(params.func)
    if err != drv.CUresult.CUDA_SUCCESS and getattr(params, "kern", None) is not None:
        err, name = drv.cuKernelGetName(params.kern)
    return name if err == drv.CUresult.CUDA_SUCCESS and name else b""


def _edges(graph) -> tuple[list, list, list]:
    """(from, to, edge data) of every edge of the graph."""
    get = getattr(drv, "cuGraphGetEdges_v2", drv.cuGraphGetEdges)  # cuda-bindings 12 or 13
    *_, count = _check(get(graph, 0))
    if count == 0:
        return [], [], []
    src, dst, data, _ = _check(get(graph, count))
    return list(src), list(dst), list(data)


def programmatic_edges(graph) -> int:
    """Turn the graph's edges from a kernel into one of our kernels into programmatic edges on
    the LAUNCH_ORDER port; return how many."""
    if not device_supports_pdl():
        return 0
    src, dst, data = _edges(graph)
    names = {int(node): _kernel_name(node) for node in src + dst}
    picked = [
        i
        for i in range(len(src))
        if data[i].type == drv.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_DEFAULT
        and names[int(src[i])] is not None
        and waits_for_predecessor(names[int(dst[i])] or b"")
    ]
    if not picked:
        return 0
    froms, tos = [src[i] for i in picked], [dst[i] for i in picked]
    remove = getattr(drv, "cuGraphRemoveDependencies_v2", drv.cuGraphRemoveDependencies)
    _check(remove(graph, froms, tos, [data[i] for i in picked], len(picked)))
    edge = drv.CUgraphEdgeData()
    edge.type = drv.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
    edge.from_port = drv.CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER
    new = [edge] * len(picked)  # the driver copies each entry
    add = getattr(drv, "cuGraphAddDependencies_v2", drv.cuGraphAddDependencies)
    try:
        _check(add(graph, froms, tos, new, len(picked)))
    except RuntimeError:  # refused: put the captured edges back, the graph stays correct
        _check(add(graph, froms, tos, [data[i] for i in picked], len(picked)))
        return 0
    return len(picked)


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
    """One recorded step: `CudaGraph(stream, fn)` captures fn's launches; `replay()` runs them.
    programmatic: whether to make the kernel edges programmatic (PDL, above)."""

    def __init__(self, stream, record: Callable[[], None], programmatic: bool = True) -> None:
        self.stream = drv.CUstream(int(stream.handle))
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(drv.cuStreamBeginCapture(self.stream, mode))
        try:
            record()
        finally:
            (graph,) = _check(drv.cuStreamEndCapture(self.stream))
        self.graph = graph
        self.programmatic_edges = programmatic_edges(graph) if programmatic else 0
        (self.exec,) = _check(drv.cuGraphInstantiate(graph, 0))

    def replay(self) -> None:
        _check(drv.cuGraphLaunch(self.exec, self.stream))

    def __del__(self) -> None:
        try:
            drv.cuGraphExecDestroy(self.exec)
            drv.cuGraphDestroy(self.graph)
        except Exception:
            pass
