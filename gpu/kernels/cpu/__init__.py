"""Numba CPU kernels of the quantized CPU path (gpu/backends/cpu_quant.py).

Each kernel's float32 numpy twin is the oracle backend's own op (gpu/backends/cpu.py) or, for
the quantization itself, the numpy function beside it in the same file.

Every kernel states `fastmath` and `error_model`: Numba compiles a function that leaves them
unset with the settings of the caller that first compiles it, so its rounding depended on
which caller that was (int16_round, meant strict, took its fastmath caller's), and a freshly
compiled q8 product rounded apart from the same product loaded from the cache.
"""
