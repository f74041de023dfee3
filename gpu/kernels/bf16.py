"""The bf16 <-> fp32 shim: bit-level conversions that run on the GPU and in the simulator.

bf16 is the top half of an IEEE float32 (sign, 8-bit exponent, 7 mantissa bits). The KV cache,
the weights and the inputs of matrix products are stored as bf16 *bits* in uint16 arrays (numpy
has no bf16 dtype, and Numba kernels only need the bits), and every kernel computes in fp32:

* bf16 -> fp32 is exact: the 16 bits become the high half of a 32-bit word;
* fp32 -> bf16 rounds to nearest, ties to even (add 0x7FFF plus the lowest kept bit, drop 16
  bits), and keeps a NaN a NaN (quiet bit forced), as `weights/bf16.py` does on the host.

Why not the bf16 intrinsics of `numba.cuda.bf16`? They are compiled from CUDA headers and need
the LTO link path, and in the CUDA simulator they (and `libdevice.int_as_float`) are stubs that
return nothing. So the shim is integer arithmetic plus one bit cast, and a module-level switch
gives the simulator a numpy-view twin of that bit cast. The host functions at the bottom are the
numpy twins the tests compare against.

The float <-> ordered-integer keys used by the sampler's threshold searches live here too: they
are the same kind of bit cast.
"""

from __future__ import annotations

import numpy as np
from numba import float32, int32, int64, uint16, uint64

from gpu.kernels.launch import SIMULATOR, device_function
from weights.bf16 import float32_to_bf16_bits

if SIMULATOR:

    def f32_bits(x):
        """The 32 bits of float32 x, as a non-negative integer."""
        return int(np.float32(x).view(np.uint32))

    def bits_f32(u):
        """The float32 whose bits are u (0 <= u < 2**32)."""
        return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)

else:
    from numba.cuda import libdevice

    @device_function
    def f32_bits(x):
        """The 32 bits of float32 x, as a non-negative int64."""
        return int64(libdevice.float_as_int(float32(x))) & 0xFFFFFFFF

    @device_function
    def bits_f32(u):
        """The float32 whose bits are u (0 <= u < 2**32); int32() wraps the top bit."""
        return libdevice.int_as_float(int32(u))


@device_function
def bf16_to_f32(bits):
    """bf16 bits (uint16) -> float32, exact."""
    return bits_f32(int64(bits) << 16)


@device_function
def bf16_of_word(word, k):
    """The k-th bf16 (k = 0..3, lowest bits first) of a uint64 word of four, as float32: the
    kernels that stream bf16 read 8 bytes a load (arrays viewed as uint64 on the host)."""
    return bits_f32(((word >> uint64(16 * k)) << uint64(16)) & uint64(0xFFFF0000))


@device_function
def f32_to_bf16(x):
    """float32 -> bf16 bits (uint16), round to nearest even, NaN stays NaN."""
    u = f32_bits(x)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return uint16((u >> 16) | 0x0040)
    return uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


@device_function
def ordered_key(x):
    """A key in [0, 2**32) that orders float32 values as floats order (-inf lowest).

    Non-negative floats get the sign bit set; negative ones are bit-flipped.
    """
    u = f32_bits(x)
    if u & 0x80000000:
        return 0xFFFFFFFF - u
    return u | 0x80000000


@device_function
def key_to_f32(key):
    """The inverse of ordered_key."""
    if key & 0x80000000:
        return bits_f32(key & 0x7FFFFFFF)
    return bits_f32(0xFFFFFFFF - key)


# --- the numpy twins ------------------------------------------------------------------------


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even, NaN-safe (what f32_to_bf16 does)."""
    return float32_to_bf16_bits(np.ascontiguousarray(values, dtype=np.float32))


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bf16 bits -> float32, exact (what bf16_to_f32 does)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16, as float32."""
    return from_bf16_bits(to_bf16_bits(values))
