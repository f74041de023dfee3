"""Numba CPU kernels of the quantized CPU path (gpu/backends/cpu_quant.py).

Each kernel's float32 numpy twin is the oracle backend's own op (gpu/backends/cpu.py) or, for
the quantization itself, the numpy function beside it in the same file.
"""
