"""A software prefetch for Numba CPU kernels: LLVM's `llvm.prefetch`, which every target lowers
to its own instruction (x86 prefetcht0, AArch64 prfm) or to nothing.

A quantized product at one token reads each weight byte once and does little arithmetic on it,
so a row's loads stall on DRAM unless they were asked for early: the hardware prefetchers do
not run far enough ahead. Asking for the next row pair while the current one is dotted took a
[3072, 576] int8 product read from DRAM (a decode step's case: the weights do not fit the
caches) from 300 to 155 us on the 2-core host, about its in-cache time.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I8P = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)
_READ, _KEEP_EVERYWHERE, _DATA = (ir.Constant(_I32, v) for v in (0, 3, 1))


@intrinsic
def prefetch(typingctx, array, index):
    """Ask for the cache line holding element `index` of a contiguous 1-D `array` (a read,
    kept in every cache level). A hint: an index past the end is harmless."""
    if not isinstance(array, types.Array) or array.ndim != 1:
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), _I8P)
        fnty = ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [address, _READ, _KEEP_EVERYWHERE, _DATA])
        return context.get_dummy_value()

    return types.none(array, index), codegen
