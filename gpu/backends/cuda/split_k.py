"""Split-K: how a batch-decode product with few output tiles is spread over the whole GPU.

A decode step of 8-256 tokens multiplies a [T, K] activation by each weight [N, K]. The time
is reading the weight (bf16, N * K * 2 bytes), so the product is fast only when enough of the
132 SMs are reading at once. cuBLAS tiles the output: one thread block per tile of ~128 x 128
(N x T) outputs, each block walking the whole K. For Llama-3.2-1B at batch 64 that is 16 blocks
for o_proj (N = 2048) and down (N = 2048, K = 8192), 24 for qkv (N = 3072): a fifth of the
SMs stream the matrix, and the H200 measured them at 0.9-1.3 TB/s against the 4.25 TB/s its
copy reaches (gate_up, N = 16384, is 128 blocks and fine).

Split-K cuts K into S equal slices and computes each slice's product separately,

    out = x @ w.T = sum_s x[:, ks] @ w[:, ks].T      (ks: the s-th K / S columns)

as ONE cuBLAS call, a strided batched product (gemm_strided_batched_ex) whose batch index is
the slice: the w and x of slice s start s * K / S elements further along the same rows (a
stride, no copy), and its [T, N] float32 partial sum goes to partials[s]. S times as many
blocks read the same bytes. The S partial sums then have to be added: not by a kernel of its
own (a launch and a dependent round trip) but by the kernel that reads the product next:

* o_proj and down (out = residual + x @ w.T): the next op is always an RMSNorm of the residual
  (the post-attention norm, the next layer's input norm, the final norm), so that kernel adds
  the partials to the residual row it loads anyway (vLLM's fused_add_rms_norm; rmsnorm.py);
* qkv: the rope / KV-write kernel reads the partial sums instead of the product (rope_kv.py).

The cost: S * T * N * 4 bytes of partials written and read back, from L2 (at batch 64 with
S = 8: 4 MB, against 8 MB of o_proj weight read from HBM), and an fp32 sum in another order
(the same numbers to rounding).

choose_split_k picks S from the shape alone (so a CUDA graph captured for a batch bucket stays
valid): enough slices that about one block per SM reads, each slice at least MIN_SLICE wide and
a multiple of 8 elements (16-byte aligned starts, which tensor-core kernels need). The tile
estimate (128 x 128) is cuBLAS's usual choice for these shapes, not a promise; the env variable
TINYCHAT_SPLIT_K overrides the choice ("auto", the default; "1" or "off": never split; a number:
that many slices wherever K allows) so the device run can sweep it
(tests/device/bench_gemm.py measures each S per shape).
"""

from __future__ import annotations

import os

ENV = "TINYCHAT_SPLIT_K"
TILE = 128  # cuBLAS's output tile for these shapes, N x T (an estimate)
MAX_SPLITS = 8
MIN_SLICE = 128  # elements of K per slice, at least
MAX_TOKENS = 512  # larger steps (prefill chunks) have tiles enough


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def setting() -> str:
    """TINYCHAT_SPLIT_K as given: "auto" (default), "off" / "1", or a number of slices."""
    value = os.environ.get(ENV, "auto").strip().lower()
    if value not in ("auto", "off") and not value.isdigit():
        raise ValueError(f"{ENV} must be auto, off or a number of slices, not {value!r}")
    return value


def fits(k: int, splits: int, min_slice: int = MIN_SLICE) -> bool:
    """Whether K cuts into `splits` slices of a multiple of 8 elements, min_slice or more."""
    return k % (8 * splits) == 0 and k // splits >= min_slice


def choose_split_k(tokens: int, n: int, k: int, num_sms: int, mode: str = "auto") -> int:
    """The number of K slices for x [tokens, k] @ w [n, k].T: 1 means one plain product."""
    if tokens < 2 or tokens > MAX_TOKENS or mode == "off":
        return 1
    if mode == "auto":
        tiles = _cdiv(n, TILE) * _cdiv(tokens, TILE)
        want, min_slice = min(MAX_SPLITS, num_sms // tiles), MIN_SLICE
    else:  # a number asked for: any slices that fit (tests split tiny models this way)
        want, min_slice = int(mode), 8
    for splits in range(want, 1, -1):
        if fits(k, splits, min_slice):
            return splits
    return 1


def partials_size(max_tokens: int, shapes: list[tuple[int, int]], num_sms: int, mode: str) -> int:
    """Float32 elements of the partials buffer the largest split product of these [N, K]
    weights needs, over every step size up to max_tokens."""
    size = 0
    for t in range(2, min(max_tokens, MAX_TOKENS) + 1):
        for n, k in shapes:
            splits = choose_split_k(t, n, k, num_sms, mode)
            if splits > 1:
                size = max(size, splits * t * n)
    return size
