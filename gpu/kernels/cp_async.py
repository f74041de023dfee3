"""Asynchronous copies from global to shared memory (cp.async), for weights staged ahead.

A plain load brings data into a register: to have many bytes in flight a thread must hold
many registers until they arrive, and a block that holds many registers leaves no room beside
it on the SM. `cp.async` (sm_80 and later) copies 16 bytes from global memory straight into
shared memory: the thread issues it and moves on, holding nothing while it is in flight; one
`cp.async.wait_all` later (plus a barrier, so every thread's copies are seen) the bytes are in
shared memory. The `.cg` form caches in L2 only: weights are read once, so L1 would only be
polluted. gemv.py's staged kernels use it to fetch a whole block's weight rows (up to ~100 KB)
before their programmatic-launch wait, with few registers, so they fit beside the kernel
before them and their weights arrive while it runs.

Numba has no such instruction; an intrinsic emits the PTX through inline assembly (as pdl.py
and mma.py do). The shared address is the generic pointer of the shared array converted with
`cvta.to.shared`; the global one is the array's generic pointer, which is its global address.
The memory clobber keeps the compiler from moving other loads and stores across either.
Numba declares a dynamic shared array 8-byte aligned, after the static ones: a kernel asks
aligned_start() where its 16-byte-aligned part begins (word 0 or 1) and allocates a spare word.

In the CUDA simulator the copy is a plain copy and the wait a no-op: the twin is exact.
"""

from __future__ import annotations

from gpu.kernels.launch import SIMULATOR, device_function

COPY_BYTES = 16  # one cp.async.cg: two uint64 words

if SIMULATOR:

    @device_function
    def copy_async_16(dst, dst_index, src, row, col):
        """dst[dst_index : dst_index + 2] = src[row, col : col + 2] (uint64 words)."""
        dst[dst_index] = src[row, col]
        dst[dst_index + 1] = src[row, col + 1]

    @device_function
    def wait_async_copies():
        """No-op in the simulator: its copies are done when issued."""

    @device_function
    def aligned_start(words):
        """The first 16-byte-aligned word of a uint64 shared array (the simulator's are)."""
        return 0

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _cp_async_cg_16(typingctx, dst, dst_index, src, row, col):
        """16 bytes from src[row, col] (a C-contiguous 2-D global array) to dst[dst_index] (a
        1-D shared array); both 16-byte aligned."""
        sig = types.void(dst, types.uint64, src, types.uint64, types.uint64)

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            dst_ty, _, src_ty, _, _ = signature.args
            dst_ary = context.make_array(dst_ty)(context, builder, args[0])
            src_ary = context.make_array(src_ty)(context, builder, args[2])
            item = ir.Constant(i64, context.get_abi_sizeof(context.get_data_type(dst_ty.dtype)))
            shared = builder.add(builder.ptrtoint(dst_ary.data, i64), builder.mul(args[1], item))
            row_stride = builder.extract_value(src_ary.strides, 0)
            source = builder.add(
                builder.ptrtoint(src_ary.data, i64),
                builder.add(builder.mul(args[3], row_stride), builder.mul(args[4], item)),
            )
            asm = (
                "{ .reg .u64 sa; cvta.to.shared.u64 sa, $0; "
                "cp.async.cg.shared.global [sa], [$1], 16; }"
            )
            fnty = ir.FunctionType(ir.VoidType(), [i64, i64])
            builder.asm(fnty, asm, "l,l,~{memory}", [shared, source], side_effect=True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def _cp_async_wait_all(typingctx):
        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.asm(fnty, "cp.async.wait_all;", "~{memory}", [], side_effect=True)
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def _shared_address(typingctx, array):
        """The shared-window address of a shared array's first element."""

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            fnty = ir.FunctionType(i64, [i64])
            generic = builder.ptrtoint(ary.data, i64)
            return builder.asm(fnty, "cvta.to.shared.u64 $0, $1;", "=l,l", [generic], False)

        return types.uint64(array), codegen

    @device_function
    def aligned_start(words):
        """The first 16-byte-aligned word of a uint64 shared array: 0, or 1 where Numba's
        8-byte alignment of a dynamic array put it at an odd word."""
        return (_shared_address(words) >> 3) & 1

    @device_function
    def copy_async_16(dst, dst_index, src, row, col):
        """Start copying src[row, col : col + 2] to dst[dst_index : dst_index + 2] (uint64
        words, 16 bytes); nothing is held while it is in flight."""
        _cp_async_cg_16(dst, dst_index, src, row, col)

    @device_function
    def wait_async_copies():
        """Wait for this thread's copies; a barrier after it makes every thread's visible."""
        _cp_async_wait_all()
