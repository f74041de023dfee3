"""Integer dot products for the q8 CPU product: int8 weight rows against int16 activations, in
AVX2's vpmaddwd (sixteen 16-bit products summed in pairs into eight 32-bit lanes a
instruction), written as LLVM IR because LLVM does not find that instruction in Numba's integer
loops (it widens them to vpmulld: 1.6-1.8x slower than float FMAs).

A row's int8 weights are sign-extended to int16 and multiplied with the token's int16
activations; each 32-bit lane holds the exact sum of its products over a stretch of CHUNK
elements (at most 2 * 127 * 32767 a vector: 256 vectors fit in a lane), and the eight lanes
are converted to float32 before they are added (their total need not fit in 32 bits). The
caller adds the stretches and scales the dot. Against converting the weights to float for
FMAs (quant_gemm.py's float product) it takes a third of the instructions a weight:
[3072, 576] at one token 129 against 157 us, at eight 181 against 251 (weights read from
DRAM, 2 cores).

`HAS_PMADDWD` says whether the target Numba compiles for has AVX2; without it the float
product runs instead.
"""

from __future__ import annotations

from llvmlite import binding as ll
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

VECTOR = 16  # int16 elements a vpmaddwd reads from each side
CHUNK = 4096  # elements a 32-bit lane may sum without overflow: 256 vectors of 16

_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
_W = ir.VectorType(ir.IntType(8), VECTOR)  # a vector's int8 weights
_X = ir.VectorType(_I16, VECTOR)  # a vector's int16 activations
_SUMS = ir.VectorType(_I32, VECTOR // 2)


def _target_has_avx2() -> bool:
    if config.CPU_NAME is not None:  # a fixed target (e.g. "generic" for portable caches)
        return "+avx2" in (config.CPU_FEATURES or "")
    return bool(ll.get_host_cpu_features().get("avx2", False))


HAS_PMADDWD = _target_has_avx2()


def _pmaddwd(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    fnty = ir.FunctionType(_SUMS, [_X, _X])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx2.pmadd.wd")
    return builder.call(fn, [a, b])


def _lane_sum(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The eight int32 lanes' total, as float32."""
    width = VECTOR // 2
    v = builder.sitofp(v, ir.VectorType(ir.FloatType(), width))
    while width > 1:
        width //= 2
        low = ir.Constant(ir.VectorType(_I32, width), list(range(width)))
        high = ir.Constant(ir.VectorType(_I32, width), list(range(width, 2 * width)))
        v = builder.fadd(builder.shuffle_vector(v, v, low), builder.shuffle_vector(v, v, high))
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _make_dots(tokens: int):
    """An intrinsic dots(qs, xq, n, t, start, stop) -> the sums (float32) of rows n and n + 1
    of qs (int8 [N, Kp]) against rows t .. t + tokens - 1 of xq (int16 [T, Kp]) over the
    vectors start .. stop - 1 (at most CHUNK elements): row n's sum for each token, then row
    n + 1's."""

    @intrinsic
    def dots(typingctx, qs, xq, n, t, start, stop):
        sig = types.UniTuple(types.float32, 2 * tokens)(qs, xq, n, t, start, stop)

        def codegen(context, builder, signature, args):
            qs_t, xq_t = signature.args[:2]
            qs_v, xq_v = args[:2]
            n, t, start, stop = (
                context.cast(builder, v, ty, types.intp)
                for v, ty in zip(args[2:], signature.args[2:], strict=True)
            )

            def row_pointer(ty, value, row, vector_type):
                array = context.make_array(ty)(context, builder, value)
                index = [row, ir.Constant(_I64, 0)]
                p = cgutils.get_item_pointer(context, builder, ty, array, index, wraparound=False)
                return builder.bitcast(p, vector_type.as_pointer())

            one = ir.Constant(_I64, 1)
            w_rows = [
                row_pointer(qs_t, qs_v, n, _W),
                row_pointer(qs_t, qs_v, builder.add(n, one), _W),
            ]
            x_rows = [
                row_pointer(xq_t, xq_v, builder.add(t, ir.Constant(_I64, i)), _X)
                for i in range(tokens)
            ]
            sums = [
                cgutils.alloca_once_value(builder, ir.Constant(_SUMS, None))
                for _ in range(2 * tokens)
            ]
            with cgutils.for_range_slice(builder, start, stop, one) as (j, _):
                ws = [builder.sext(builder.load(builder.gep(w, [j]), align=1), _X) for w in w_rows]
                for i, x_row in enumerate(x_rows):
                    x = builder.load(builder.gep(x_row, [j]), align=2)
                    for r, w in enumerate(ws):
                        acc = sums[r * tokens + i]
                        builder.store(builder.add(builder.load(acc), _pmaddwd(builder, w, x)), acc)
            values = [_lane_sum(builder, builder.load(acc)) for acc in sums]
            return context.make_tuple(builder, signature.return_type, values)

        return sig, codegen

    return dots


dots_1, dots_2, dots_4 = _make_dots(1), _make_dots(2), _make_dots(4)
