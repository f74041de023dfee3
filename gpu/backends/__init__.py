"""Backends: the same Llama forward on numpy (cpu) or on Numba kernels + cuBLAS (cuda)."""

from __future__ import annotations

from gpu.backends.base import Backend


def cuda_available() -> bool:
    """True when numba-cuda is installed and sees an NVIDIA GPU (never raises)."""
    try:
        from numba import config, cuda

        # The CUDA simulator (kernel tests) says "available" but is no GPU.
        return not config.ENABLE_CUDASIM and bool(cuda.is_available())
    except Exception:
        return False


CPU_DEFAULT_PRECISION = "q8"


def get_backend(
    device: str = "auto",
    precision: str | None = None,
    cpu_threads: int | None = None,
    batch_invariant: bool = False,
) -> Backend:
    """ "cpu", "cuda", or "auto" (cuda when a GPU is there, else cpu).

    On the cpu, `precision` picks the weights' form (EngineConfig.precision): "float32" is the
    numpy oracle, "q8" / "q4" the quantized path (None: CPU_DEFAULT_PRECISION); `cpu_threads`
    its threads (None: every usable core). The cuda backend ignores both; `batch_invariant`
    (EngineConfig.batch_invariant) picks its batch-invariant ops. The cpu backends are
    batch-invariant as they are."""
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    if device == "cpu":
        precision = precision or CPU_DEFAULT_PRECISION
        if precision == "float32":
            from gpu.backends.cpu import CpuBackend

            return CpuBackend(cpu_threads)
        from gpu.backends.cpu_quant import CpuQuantBackend
        from gpu.backends.cpu_threads import resolve_threads

        return CpuQuantBackend(precision, resolve_threads(cpu_threads))
    if device == "cuda":
        if not cuda_available():
            raise RuntimeError(
                "device 'cuda' asked for, but no NVIDIA GPU is visible to numba-cuda "
                "(install tinychat[cuda] on a machine with a GPU, or use --device cpu)"
            )
        if batch_invariant:
            from gpu.backends.cuda.batch_invariant import BatchInvariantCudaBackend

            return BatchInvariantCudaBackend()
        from gpu.backends.cuda import CudaBackend

        return CudaBackend()
    raise ValueError(f"unknown device {device!r}: use cpu, cuda or auto")


__all__ = ["Backend", "cuda_available", "get_backend"]
