"""The GPU kernels: Numba `@cuda.jit` functions, one concern per file, each next to a small
launcher and pointing at its numpy twin (the matching method of gpu/backends/cpu.py, or
gpu/sampling/numpy_sampler.py for the sampler).

    bf16.py              bf16 <-> fp32 bit shim (runs in the CUDA simulator too)
    block_reduce.py      block-wide sum / max / argmax: warp shuffles on the GPU, a
                         shared-memory tree in the simulator
    embedding.py         token embedding lookup, gather_rows
    gemv.py              decode matrix-vector products with RMSNorm / rope+KV / SiLU / residual
                         fused in (one-token steps)
    gemv_mma.py          the same products for steps of 2-8 tokens, the tokens riding along in
                         tensor-core instructions, rope+KV / SiLU / residual fused in
    rmsnorm.py           rmsnorm, for prefill steps, gemv_mma.py and the composed path
                         (one-token steps fuse the norm into gemv.py's prologue)
    rope_kv.py           rotate-half RoPE fused with the paged KV-cache write
    attention_decode.py  paged decode attention: the kernel and its launcher, which run
        _ffma.py         the plain walk: a thread group per token, online softmax per slot
        _tc.py           the tensor-core walk, and a warp per head at large batches
        _split.py        split-KV: the context in chunks, merged by the last block done
    attention_prefill.py paged causal attention for prefill chunks and mixed batches
        _tiles.py        its tile configurations
        _split.py        split-KV for short chunks over long histories, and the merge
    activation.py        silu(gate) * up
    sampling.py          greedy / temperature / top-k / top-p / min-p / penalties / bans
        _scores.py       pass 1: bans and penalties, greedy argmax or x / T
        _radix.py        top-k and top-p thresholds by radix select, the candidate copy
        _histogram.py    the radix histogram's block-wide steps
        _draw.py         Gumbel-max over what the thresholds keep
        _common.py       row layouts, packed max, last-block merge, counter-based uniforms
    argmax.py            the all-greedy fast path: two-stage argmax over vocabulary chunks
    launch.py            the simulator switch and block sizes
    mma.py               tensor cores through inline PTX: mma.sync m16n8k16 bf16 (the decode
                         attention's tensor-core walk and gemv_mma.py use it)
    pdl.py               griddepcontrol.wait: every kernel waits for its predecessor there, so
                         a graph may launch it early (programmatic dependent launch)

The matrix products of one-token steps go through gemv.py, those of 2-8 tokens through
gemv_mma.py (but for long rows and the LM head: see its SERVE_MAX_K / SERVE_MAX_N); those of
larger steps (prefill, big decode batches) are not here: they go through cuBLAS
(gpu/backends/cuda/cublas.py).

    compile_cache.py     where the compiled kernels are kept: $TINYCHAT_HOME/numba-cache

Kernels compile on first use (once per process per argument types) and are cached on disk
(`cache=True`) in the folder compile_cache.py sets up, before any kernel module is imported
(here); the cuda executor compiles every kernel a reply can need before the engine is ready
(gpu/backends/cuda/precompile.py). The cache is stamped with a hash of every file here, so an
edit to a helper (bf16.py, block_reduce.py, pdl.py) recompiles the kernels that import it.
"""

from gpu.kernels.compile_cache import use_cache_dir

use_cache_dir()
