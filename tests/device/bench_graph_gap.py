"""What the GPU waits between two decode graphs, by what is queued between them (dev-only).

trace_loop.py finds ~19-24 us between the last kernel of one decode step and the first of the
next, of which the input upload itself is 3-5 us: most of it is latency around the copy. This
replays a stand-in graph (KERNELS one-block kernels in a chain, ~200 us in all) back to back in
several ways and reports each way's period minus the graph's own (variant "graph"):

    graph        the graph alone, back to back
    h2d          a host-to-device copy of NBYTES from pinned memory before each replay (today)
    d2d_node     the graph starts with a device-to-device copy of NBYTES (no host copy)
    side_stream  d2d_node, plus the host copy on a second stream into the side buffer the node
                 reads, overlapping the previous replay: the copy waits for an event the graph
                 records after its copy node, the replay waits for the copy's event

    python3 tests/device/bench_graph_gap.py
"""

from __future__ import annotations

import numpy as np
from common import Results
from cuda.bindings import driver as drv
from numba import cuda

from gpu.backends.cuda.graphs import CudaGraph, _check

KERNELS = 84
REPS = 200


@cuda.jit
def spin(a, n):
    if cuda.threadIdx.x == 0:
        x = a[0]
        for _ in range(n):
            x = x * np.float32(0.999999) + np.float32(1e-7)
        a[0] = x


def period_us(stream, step, reps: int = REPS) -> float:
    start, end = cuda.event(), cuda.event()
    for _ in range(10):
        step()
    start.record(stream)
    for _ in range(reps):
        step()
    end.record(stream)
    end.synchronize()
    return cuda.event_elapsed_time(start, end) * 1000 / reps


def raw(stream) -> drv.CUstream:
    return drv.CUstream(int(stream.handle))


def run(nbytes: int, spin_n: int) -> dict:
    stream, side = cuda.stream(), cuda.stream()
    acc = cuda.to_device(np.ones(1, np.float32), stream=stream)
    pinned = cuda.pinned_array(nbytes, np.uint8)
    fixed = cuda.device_array(nbytes, np.uint8, stream=stream)
    side_buf = cuda.device_array(nbytes, np.uint8, stream=stream)
    flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
    (consumed,) = _check(drv.cuEventCreate(flags))
    (uploaded,) = _check(drv.cuEventCreate(flags))

    def kernels():
        for _ in range(KERNELS):
            spin[1, 32, stream](acc, spin_n)

    def with_copy_node():
        fixed.copy_to_device(side_buf, stream=stream)
        external = drv.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL
        _check(drv.cuEventRecordWithFlags(consumed, raw(stream), external))
        kernels()

    g_plain = CudaGraph(stream, kernels, programmatic=False)
    g_node = CudaGraph(stream, with_copy_node, programmatic=False)

    def h2d():
        fixed.copy_to_device(pinned, stream=stream)
        g_plain.replay()

    def side_stream():
        _check(drv.cuStreamWaitEvent(raw(side), consumed, 0))
        side_buf.copy_to_device(pinned, stream=side)
        _check(drv.cuEventRecord(uploaded, raw(side)))
        _check(drv.cuStreamWaitEvent(raw(stream), uploaded, 0))
        g_node.replay()

    result = {"graph": period_us(stream, g_plain.replay)}
    for name, fn in (("h2d", h2d), ("d2d_node", g_node.replay), ("side_stream", side_stream)):
        result[name] = period_us(stream, fn)
    base = result["graph"]
    return {k: round(v if k == "graph" else v - base, 2) for k, v in result.items()}


def main() -> None:
    results = Results("bench_graph_gap")
    for nbytes in (2048, 20480, 131072):
        for spin_n in (64,):
            results.section(f"{nbytes} bytes, spin {spin_n}", run, nbytes, spin_n)


if __name__ == "__main__":
    main()
