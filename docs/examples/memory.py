"""GPU and CPU memory: what a model takes, what the KV cache takes, and the decode floor.

Host memory holds the checkpoint (memory-mapped: weights/safetensors_format.py) and, on the
numpy backend, the weights upcast to float32 and the KV cache. GPU memory holds the bf16
weights, the activation buffers of the largest step, and then, sized from what is left, the
paged KV cache (gpu/loader.py: build_engine; gpu/backends/cuda/backend.py:
CudaBackend.num_kv_blocks). Between the two, bytes cross the PCIe bus: weights once at load;
each step's inputs (a few KB, staged in pinned host memory) and sampled ids (read through
mapped host memory, with no copy on the stream: gpu/backends/cuda/sampler.py).

A decode step reads every weight once, so weight bytes over the copy bandwidth is the fastest
any engine can decode one sequence (gpu/bench/roofline.py: decode_step_floor). The script prints
those numbers for the two models the project measures, on the bandwidths measured on the lent
GPUs (BENCHMARKS.md), from the configs alone (nothing is allocated).

    python docs/examples/memory.py
"""

from __future__ import annotations

import math

from gpu.bench.roofline import Ceilings, count_params, decode_step_floor
from gpu.loader import kv_bytes_per_block
from gpu.presets import preset_config
from weights.checkpoint import llama_tensor_shapes

GPUS = {  # measured device copy rate (bytes read + written per second), bf16 GEMM FLOP/s
    "H200": Ceilings(4.25e12, 700e12, "BENCHMARKS.md"),
    "H100": Ceilings(3.03e12, 776e12, "BENCHMARKS.md"),
}
GIB = 2**30


def main() -> None:
    for name in ("smollm2-135m", "llama-3.2-1b"):
        config = preset_config(name)
        params = count_params(config)
        shapes = llama_tensor_shapes(config)
        assert params == sum(math.prod(s) for s in shapes.values())  # one count, two ways
        kv_token = kv_bytes_per_block(config, 1, 2)  # bf16 K and V of every layer
        print(f"{name}: {params / 1e6:,.0f}M parameters")
        bf16, f32 = params * 2 / GIB, params * 4 / GIB
        print(f"  weights   {bf16:.2f} GiB in bf16 (GPU), {f32:.2f} GiB in float32 (CPU)")
        print(f"  KV cache  {kv_token / 1024:.0f} KiB a token in bf16 (twice that in float32)")
        for gpu, ceilings in GPUS.items():
            floor = decode_step_floor(config, 1, 32, 2, 2, ceilings)
            ms, gb = floor["floor_s"] * 1e3, floor["bytes"] / 1e9
            print(f"  {gpu}: a batch-1 decode step reads {gb:.2f} GB: at least {ms:.3f} ms,")
            print(f"        at most {1e3 / ms:,.0f} tok/s")


if __name__ == "__main__":
    main()
