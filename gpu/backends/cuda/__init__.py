"""The cuda backend: Numba kernels (gpu/kernels/) and cuBLAS on one stream, bf16 weights and KV
cache, all device memory allocated at start, and an executor whose steps can be captured into
CUDA graphs."""

from gpu.backends.cuda.backend import CudaBackend

__all__ = ["CudaBackend"]
