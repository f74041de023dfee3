"""bf16 <-> float32 conversion: exact upcast, round-to-nearest-even downcast, NaN stays NaN."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from weights import bf16_bits_to_float32, float32_to_bf16_bits


def reference_bf16(x: float) -> int:
    """Round one float32 to bf16 bits the slow, obvious way (integers, ties to even)."""
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    if (u & 0x7F800000) == 0x7F800000 and (u & 0x007FFFFF):  # NaN
        return (u >> 16) | 0x0040
    upper, lower = u >> 16, u & 0xFFFF
    if lower > 0x8000 or (lower == 0x8000 and upper & 1):
        upper += 1
    return upper


def test_upcast_is_exact_for_every_bf16_value() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    f = bf16_bits_to_float32(bits)
    assert f.dtype == np.float32
    finite = np.isfinite(f)
    np.testing.assert_array_equal(float32_to_bf16_bits(f[finite]), bits[finite])
    assert np.isnan(f[~finite & (bits & 0x7F != 0)]).all()


def test_ties_round_to_even() -> None:
    # 1 + 2^-8 is half-way between bf16 1.0 and the next value: rounds to the even (1.0).
    one_plus_half_ulp = np.float32(1.0 + 2.0**-8)
    assert float32_to_bf16_bits(np.array([one_plus_half_ulp]))[0] == 0x3F80
    # 1 + 3 * 2^-8 is half-way between two bf16 values whose even neighbour is above.
    assert float32_to_bf16_bits(np.array([np.float32(1 + 3 * 2.0**-8)]))[0] == 0x3F82


def test_special_values() -> None:
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.4e38, 1e-45], np.float32)
    bits = float32_to_bf16_bits(vals)
    back = bf16_bits_to_float32(bits)
    assert bits[0] == 0x0000 and bits[1] == 0x8000
    assert back[2] == np.inf and back[3] == -np.inf
    assert np.isnan(back[4]) and np.isnan(back[5])
    assert back[6] == np.inf  # the largest float32 rounds past the largest bf16
    # A NaN whose payload is only in the low bits must not turn into infinity.
    low_payload_nan = np.array([0x7F800001], dtype=np.uint32).view(np.float32)
    assert np.isnan(bf16_bits_to_float32(float32_to_bf16_bits(low_payload_nan)))[0]


@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1))
def test_matches_reference_rounding(values: list[float]) -> None:
    got = float32_to_bf16_bits(np.array(values, dtype=np.float32))
    want = [reference_bf16(v) for v in values]
    assert got.tolist() == want


def test_shapes_are_kept() -> None:
    a = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    bits = float32_to_bf16_bits(a)
    assert bits.shape == a.shape and bits.dtype == np.uint16
    assert bf16_bits_to_float32(bits).shape == a.shape
    np.testing.assert_allclose(bf16_bits_to_float32(bits), a, rtol=2**-8)


def test_chunked_conversion_matches_reference_across_chunk_edges(monkeypatch) -> None:
    """The conversion works a chunk at a time: NaNs, ties and infinities on either side of a
    chunk edge, a last chunk that is short, and a strided (non-contiguous) input."""
    import weights.bf16

    monkeypatch.setattr(weights.bf16, "_CHUNK", 5)
    rng = np.random.default_rng()
    values = rng.standard_normal(23).astype(np.float32)
    values[[4, 5, 14]] = [np.nan, -np.nan, np.inf]  # the last of chunk 1, the first of chunk 2
    values[9] = np.float32(1.0 + 2.0**-8)  # a tie, the last of chunk 2
    values[22] = np.array([0x7F800001], np.uint32).view(np.float32)[0]  # low-payload NaN
    want = [reference_bf16(float(v)) for v in values]
    assert float32_to_bf16_bits(values).tolist() == want
    strided = np.stack([values, -values], axis=1)[:, 0]  # a view with stride 8 bytes
    assert float32_to_bf16_bits(strided).tolist() == want
    grid = float32_to_bf16_bits(values[:20].reshape(4, 5).T)  # transposed: not C-contiguous
    assert grid.shape == (5, 4) and grid.T.reshape(-1).tolist() == want[:20]
