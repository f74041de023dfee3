"""L2 prefetch: pull the next product's weights toward the SMs while the GPU waits on latency.

A batch-1 Llama-3.2-1B layer reads 121.6 MB of weights, 28.6 us at the H200's 4.25 TB/s copy
rate, yet took ~47 us (sixth and seventh sessions' traces): between the products the memory
sits idle. After qkv come attention (~7 us on the critical path, a few KB of KV read) and
o_proj (8.4 MB), then gate_up, the largest matrix (67 MB), which the GPU can only stream once
o_proj's blocks leave the SMs: its weights are held in registers, and the register file is full
of o_proj's. Programmatic launch (pdl.py) lets a kernel's blocks start early, but they can
preload only what fits in the SMs beside the kernel before them.

L2 can hold more (50 MB on the H100 and H200) and needs no SM resources at all. Hopper's bulk
copy engine prefetches a contiguous range into L2 with one instruction,
`cp.async.bulk.prefetch.L2.global [address], size`: a thread issues it and goes on, holding no
register and no shared memory while the bytes move. So a kernel that starts early (o_proj, whose
blocks wait for attention) issues, before its grid_dependency_sync, prefetches of the first
part of the next matrix: the memory streams gate_up's weights during attention instead of idling,
and gate_up's first blocks read them from L2.

A prefetch is only a hint: it changes no result. The address is a plain integer (the weights'
device address, fixed for the life of the engine, so a captured graph may bake it in). It exists
from sm_90 on, like griddepcontrol, and is guarded the same way; in the CUDA simulator it is a
no-op.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from numba import cuda

from gpu.kernels.launch import SIMULATOR, device_function, env_choice

# The most bytes one prefetch instruction is given (its size operand is 32-bit; smaller pieces
# also spread one block's range over the copy engine's queue).
PIECE_BYTES = 1 << 15
# How much of the next matrix each issuing kernel prefetches, MB, in launch order: the qkv
# product's blocks ($TINYCHAT_L2_PREFETCH_QKV_MB), then o_proj's, which wait for attention
# ($TINYCHAT_L2_PREFETCH_MB); 0: none, the default until measured on the H200. Together capped
# at L2_SHARE of the device's L2, so that what is fetched first is not evicted by what is
# fetched last.
ISSUER_MB = (
    env_choice("TINYCHAT_L2_PREFETCH_QKV_MB", 0, range(1 << 12)),
    env_choice("TINYCHAT_L2_PREFETCH_MB", 0, range(1 << 12)),
)
QKV, O_PROJ = 0, 1
L2_SHARE = 0.75
# Which of the next kernel's row groups: spread evenly over its grid (1), so that every wave of
# its blocks finds some rows in L2 and streams the others, keeping the memory busy throughout;
# or its first blocks' (0), whose waves then read L2 alone while the memory idles.
SPREAD = env_choice("TINYCHAT_L2_PREFETCH_SPREAD", 1, (0, 1))


class L2Prefetch(NamedTuple):
    """A kernel's prefetch arguments. The next matrix, at device address `base`, is read by its
    kernel in row groups of `group_bytes` (one block's rows), `groups` of them in a part; where
    `second` is not 0 it has a second part at base + second, read alongside the first (the two
    halves of a merged [gate; up] matrix, in gemv.py's SiLU epilogue). `selected` groups of
    each part are prefetched in all, by one kernel or two; this kernel issues the selected
    groups first, first + 1, ..., last - 1."""

    base: int
    second: int
    group_bytes: int
    groups: int
    selected: int
    first: int
    last: int


NO_PREFETCH = L2Prefetch(0, 0, 0, 0, 0, 0, 0)


@functools.cache
def _l2_bytes() -> int:
    return 4 << 20 if SIMULATOR else int(cuda.get_current_device().L2_CACHE_SIZE)


def plan(w: Any, group_rows: int, halves: bool, issuer: int = O_PROJ) -> L2Prefetch:
    """Prefetch arguments for w, read by blocks of `group_rows` rows (of each half of w, with
    `halves`), for the issuing kernel `issuer` (QKV or O_PROJ), within ISSUER_MB and the L2."""
    parts = 2 if halves else 1
    part_bytes = w.nbytes // parts
    group_bytes = group_rows * w.nbytes // w.shape[0]
    if group_bytes <= 0 or group_bytes % 16 or part_bytes % 16:
        return NO_PREFETCH
    groups = part_bytes // group_bytes
    cap = int(_l2_bytes() * L2_SHARE)
    step = parts * group_bytes  # the bytes of one selected group, all parts

    def count(mb: int) -> int:
        return min(groups, min(mb << 20, cap) // step)

    selected = count(sum(ISSUER_MB))
    first, last = count(sum(ISSUER_MB[:issuer])), count(sum(ISSUER_MB[: issuer + 1]))
    if last <= first:
        return NO_PREFETCH
    second = part_bytes if halves else 0
    return L2Prefetch(device_address(w), second, group_bytes, groups, selected, first, last)


def device_address(w: Any) -> int:
    """Where a device array's data starts (in the simulator, its host array's address)."""
    return int(w.ctypes.data if SIMULATOR else w.device_ctypes_pointer.value)


if SIMULATOR:

    @device_function
    def prefetch_l2(address, nbytes):
        """No-op in the simulator: there is no L2 to warm."""

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from gpu.kernels.pdl import MIN_ARCH, _cuda_arch

    @intrinsic
    def _bulk_prefetch_l2(typingctx, address, nbytes):
        if not isinstance(address, types.Integer) or not isinstance(nbytes, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            addr = context.cast(builder, args[0], signature.args[0], types.uint64)
            size = context.cast(builder, args[1], signature.args[1], types.uint32)
            hopper = builder.icmp_signed(
                ">=", _cuda_arch(builder), ir.Constant(ir.IntType(32), MIN_ARCH)
            )
            with builder.if_then(hopper):
                fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64), ir.IntType(32)])
                builder.asm(
                    fnty,
                    "cp.async.bulk.prefetch.L2.global [$0], $1;",
                    "l,r,~{memory}",
                    [addr, size],
                    side_effect=True,
                )
            return context.get_dummy_value()

        return types.void(address, nbytes), codegen

    @device_function
    def prefetch_l2(address, nbytes):
        """Start moving bytes [address, address + nbytes) of global memory into L2 (address and
        nbytes multiples of 16); returns at once."""
        _bulk_prefetch_l2(address, nbytes)


@device_function
def block_share(count, block, nblocks):
    """[first, last) of block `block`'s share when `count` items are dealt to nblocks blocks."""
    return count * block // nblocks, count * (block + 1) // nblocks


@device_function
def selected_group(j, groups, selected):
    """The row group that the j-th of `selected` prefetched groups is: spread evenly over all
    `groups` (SPREAD), or the j-th."""
    if SPREAD:
        return j * groups // selected
    return j


@device_function
def prefetch_block_share(pf, part, block, nblocks):
    """This block's share of the prefetch of part `part` (0, or 1 where pf's second is not 0):
    its selected row groups, each issued in pieces of at most PIECE_BYTES. pf: the L2Prefetch
    fields (base, second, group_bytes, groups, selected, first, last) as a tuple."""
    base, second, group_bytes, groups, selected, first, last = pf
    if last <= first or (part == 1 and second == 0) or part > 1:
        return
    origin = base + (second if part == 1 else 0)
    lo, hi = block_share(last - first, block, nblocks)
    for j in range(first + lo, first + hi):
        address = origin + selected_group(j, groups, selected) * group_bytes
        offset = 0
        while offset < group_bytes:
            size = min(group_bytes - offset, PIECE_BYTES)
            prefetch_l2(address + offset, size)
            offset += size
