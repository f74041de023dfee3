"""An arithmetic fence: a float value that fast-math may not reassociate or fuse across.

The q8 product's last steps (quant_gemm._int16_pair_dots: the float sum of exact integer
chunk dots, the two scales, `out += value`) run in the four-, two- and one-token passes, in
the per-op product and inlined into the whole-step decode kernel (decode_step.py), most of them
compiled with fastmath. There LLVM fused `out + a * s` into an FMA in some of those places and
not in others, so a token's logits depended on its place in the batch and on whether its step
also held a prefill: a seeded request sampled other tokens alone than among 256 (6 of 256
streams of 32 tokens, the default model). Each fenced value is rounded where the source
rounds it, in every context: llvm.arithmetic.fence on x86 (the q8 integer path's only ISA);
elsewhere the value as it is.
"""

from __future__ import annotations

from llvmlite import binding as ll
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_X86 = ll.get_process_triple().startswith(("x86_64", "i686", "i386"))


@intrinsic
def fence(typingctx, x):
    """x (float32 or float64), rounded as computed: no fast-math rewrite reaches through it."""
    if x not in (types.float32, types.float64):
        return None

    def codegen(context, builder, sig, args):
        if not _X86:
            return args[0]
        ty = ir.FloatType() if x == types.float32 else ir.DoubleType()
        name = "llvm.arithmetic.fence." + ("f32" if x == types.float32 else "f64")
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty]), name)
        return builder.call(fn, [args[0]])

    return x(x), codegen
