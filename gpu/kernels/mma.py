"""Tensor cores from Numba: one warp-wide bf16 matrix multiply-accumulate, mma.sync m16n8k16.

Numba exposes no tensor-core instruction, but it can emit any PTX through an intrinsic with
inline assembly (pdl.py does the same for griddepcontrol). This module wraps the one the
attention kernels need: D = A @ B + C for a 16 x 16 bf16 A, a 16 x 8 bf16 B and 16 x 8 fp32
C / D, computed by the 32 threads of a warp together, each holding a fixed piece ("fragment")
of every operand in registers. With it a warp does 16 x 8 x 16 = 2,048 multiply-adds in one
instruction instead of 64 FFMAs a thread: what the decode attention, issue-bound at GQA 4
(attention_decode.py: 256 FFMAs of a 901-instruction loop per tile), needs to stop counting FMAs.

Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"). A thread's
lane is g * 4 + c (g = lane // 4, the "group", c = lane % 4); a .b32 register holds two bf16,
the lower-index element in the low 16 bits:

    A (16 x 16, row):  a0 = A[g, 2c:2c+2]      a1 = A[g+8, 2c:2c+2]
                       a2 = A[g, 2c+8:2c+10]   a3 = A[g+8, 2c+8:2c+10]
    B (16 x 8, col):   b0 = B[2c:2c+2, g]      b1 = B[2c+8:2c+10, g]
    C, D (16 x 8):     d0, d1 = D[g, 2c], D[g, 2c+1]   d2, d3 = D[g+8, 2c], D[g+8, 2c+1]

The sum over k does not care which k is which, so a kernel may hand the tensor core any
permutation of the k index, the same one for A and B: a thread can then load 8 contiguous bytes
of a K row (4 dimensions) as its a0/a2 pair, instead of the two 4-byte pieces the layout above
spells out.

sm_80 and later (bf16 mma). Kernels call mma_m16n8k16 with three shared scratch arrays
(scratch_shapes): in the CUDA simulator, which has no warp-wide instruction, it is a twin that
posts every lane's fragments there and computes each lane's D elements from the layout above
(one warp: the simulator's blocks are 32 threads); on the GPU the scratch is unused.
tests/test_kernels_mma.py checks both against numpy: the twin in the simulator (CI), the
instruction on the device, so the two agree.
"""

from __future__ import annotations

from numba import cuda, float32, types, uint32

from gpu.kernels.launch import SIMULATOR, device_function
from gpu.kernels.pdl import grid_dependency_sync

# The simulator twin's scratch: every lane's fragments, in shared memory (kernels allocate it
# with scratch_shapes(); on the GPU the arrays are 1 x 1 and unused).
FRAG_SHAPES = ((32, 4), (32, 2), (32, 4))


def scratch_shapes(simulator: bool) -> tuple:
    """(A, B, C) fragment scratch shapes a kernel allocates (uint32, uint32, float32)."""
    return FRAG_SHAPES if simulator else ((1, 1),) * 3


if SIMULATOR:
    import numpy as np

    # Where each lane's fragment registers sit in A, B and D (the module docstring): for lane
    # L and register r, the row and column of its low bf16 (the high one is the next column
    # of A, the next row of B); D's four floats likewise.
    _G, _C = np.arange(32) // 4, np.arange(32) % 4
    _A_ROW = np.stack([_G, _G + 8, _G, _G + 8], axis=1)
    _A_COL = np.stack([2 * _C, 2 * _C, 2 * _C + 8, 2 * _C + 8], axis=1)
    _B_ROW = np.stack([2 * _C, 2 * _C + 8], axis=1)
    _B_COL = np.stack([_G, _G], axis=1)
    _D_ROW = np.stack([_G, _G, _G + 8, _G + 8], axis=1)
    _D_COL = np.stack([2 * _C, 2 * _C + 1, 2 * _C, 2 * _C + 1], axis=1)

    def _halves(words) -> tuple[np.ndarray, np.ndarray]:
        """uint32 words -> (low bf16, high bf16) as float32."""
        words = np.asarray(words, dtype=np.uint32)
        low = ((words & 0xFFFF) << 16).view(np.float32)
        high = (words & 0xFFFF0000).view(np.float32)
        return low, high

    def _tile(fa, fb, fc) -> None:
        """D = A @ B + C for the whole warp from its posted fragments, written over fc in the
        same lane layout (float64 sums, rounded once to float32)."""
        a = np.zeros((16, 16))
        low, high = _halves(fa)
        a[_A_ROW, _A_COL], a[_A_ROW, _A_COL + 1] = low, high
        b = np.zeros((16, 8))
        low, high = _halves(fb)
        b[_B_ROW, _B_COL], b[_B_ROW + 1, _B_COL] = low, high
        d = np.zeros((16, 8))
        d[_D_ROW, _D_COL] = np.asarray(fc, dtype=np.float32)
        d += a @ b
        fc[:, :] = d[_D_ROW, _D_COL].astype(np.float32)

    @device_function
    def mma_m16n8k16(fa, fb, fc, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """The simulator twin of mma_bf16_m16n8k16 (one warp = the simulator's 32-thread
        block): the lanes post their fragments to shared memory, lane 0 computes the tile as
        the layout says, and each lane takes its four D elements back."""
        lane = cuda.threadIdx.x % 32
        fa[lane, 0], fa[lane, 1], fa[lane, 2], fa[lane, 3] = a0, a1, a2, a3
        fb[lane, 0], fb[lane, 1] = b0, b1
        fc[lane, 0], fc[lane, 1], fc[lane, 2], fc[lane, 3] = c0, c1, c2, c3
        cuda.syncthreads()
        if lane == 0:
            _tile(fa, fb, fc)
        cuda.syncthreads()
        # No barrier after: a lane reads and next posts only its own row of fc, and lane 0
        # overwrites them only after the next call's first barrier.
        return (
            types.float32(fc[lane, 0]),
            types.float32(fc[lane, 1]),
            types.float32(fc[lane, 2]),
            types.float32(fc[lane, 3]),
        )

else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    _F32x4 = types.UniTuple(types.float32, 4)

    @intrinsic
    def mma_bf16_m16n8k16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """(d0, d1, d2, d3) = this thread's fragment of A @ B + C (see the module docstring);
        a*, b*: uint32 (two bf16 each), c*: float32. Every thread of the warp must call it."""
        sig = _F32x4(
            types.uint32, types.uint32, types.uint32, types.uint32, types.uint32, types.uint32,
            types.float32, types.float32, types.float32, types.float32,
        )  # fmt: skip

        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            asm = (
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
            )
            constraints = "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"
            result = builder.asm(fnty, asm, constraints, list(args), side_effect=False)
            values = [builder.extract_value(result, i) for i in range(4)]
            return context.make_tuple(builder, signature.return_type, values)

        return sig, codegen

    @device_function
    def mma_m16n8k16(fa, fb, fc, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """mma_bf16_m16n8k16; the scratch arrays are the simulator twin's (unused here)."""
        return mma_bf16_m16n8k16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)


@device_function
def pack_bf16x2(lo, hi):
    """Two bf16 bit patterns (uint16) as one uint32 register: lo in the low half."""
    return types.uint32(lo) | (types.uint32(hi) << types.uint32(16))


FA_SHAPE, FB_SHAPE, FC_SHAPE = scratch_shapes(SIMULATOR)


@cuda.jit(cache=True)
def mma_tile_kernel(a, b, c, d):
    """d = a @ b + c for one tile, by one warp: a [16, 16] and b [16, 8] bf16 bits, c and d
    [16, 8] float32. Each thread gathers its fragments as the module docstring lays them out;
    tests/test_kernels_mma.py checks the result against numpy, which checks the layout."""
    fa = cuda.shared.array(FA_SHAPE, uint32)
    fb = cuda.shared.array(FB_SHAPE, uint32)
    fc = cuda.shared.array(FC_SHAPE, float32)
    grid_dependency_sync()
    lane = cuda.threadIdx.x
    g = lane // 4
    k = 2 * (lane % 4)
    d0, d1, d2, d3 = mma_m16n8k16(
        fa, fb, fc,
        pack_bf16x2(a[g, k], a[g, k + 1]),
        pack_bf16x2(a[g + 8, k], a[g + 8, k + 1]),
        pack_bf16x2(a[g, k + 8], a[g, k + 9]),
        pack_bf16x2(a[g + 8, k + 8], a[g + 8, k + 9]),
        pack_bf16x2(b[k, g], b[k + 1, g]),
        pack_bf16x2(b[k + 8, g], b[k + 9, g]),
        c[g, k], c[g, k + 1], c[g + 8, k], c[g + 8, k + 1],
    )  # fmt: skip
    d[g, k] = d0
    d[g, k + 1] = d1
    d[g + 8, k] = d2
    d[g + 8, k + 1] = d3


SIGNATURES = {
    "mma_tile_kernel": ["void(uint16[:, ::1], uint16[:, ::1], float32[:, ::1], float32[:, ::1])"]
}
