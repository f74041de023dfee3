"""Programmatic dependent launch (PDL): let the next kernel start while this one finishes.

A decode step at batch 1 is a chain of ~85 (Llama-3.2-1B) to ~150 (SmolLM2-135M) small kernels,
each of a few microseconds. Replayed from a CUDA graph, kernel N+1 normally starts only once
kernel N has completed and flushed its writes: every boundary costs the launch of N+1's blocks
plus the first round trip of its loads, both idle time of the whole GPU. Hopper can overlap
them. A graph edge of type "programmatic" from N to N+1 (port LAUNCH_ORDER: once every block of
N has *started*) lets N+1's blocks be scheduled while N still runs; N+1 then executes
`griddepcontrol.wait` (CUDA's cudaGridDependencySynchronize) before it touches anything N
writes, and that instruction returns once N has completed and its memory is visible.

So every kernel of gpu/kernels calls grid_dependency_sync() before its first read of anything
a previous kernel may write (activations, the residual stream, the KV cache, logits) and before
its first write. What comes before the call may read only what no kernel of the step writes:
the weights. The matrix-vector kernel (gemv.py) issues all its weight loads first, so at batch 1
the weights of the next product are already on their way while the previous kernel's last
blocks finish. The order is transitive: N+2 may start before N ends, but its wait returns only
once N+1 has completed, and N+1 completed only after its own wait for N.

Without a programmatic edge (eager launches, cuBLAS's kernels, a graph captured with PDL off)
the instruction returns at once: the kernels are correct under either launch. The edges are
made by gpu/backends/cuda/graphs.py after capture, only into kernels of this package (whose
names it recognises), so a cuBLAS kernel, which does not wait, is never started early.

The instruction is PTX inline assembly, emitted through a Numba intrinsic; its `memory` clobber
keeps the compiler from moving loads or stores across it. It exists from sm_90 (Hopper) on, so
the intrinsic guards it with NVVM's `__nvvm_reflect("__CUDA_ARCH")`, which libNVVM folds to the
target's architecture: a build for an older GPU drops the instruction (and graphs.py makes no
programmatic edge there). In the CUDA simulator (blocks run one after another) it is a no-op.
"""

from __future__ import annotations

from gpu.kernels.launch import SIMULATOR, device_function

if SIMULATOR:

    @device_function
    def grid_dependency_sync():
        """No-op in the simulator: there is only ever one grid in flight."""

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    MIN_ARCH = 900  # griddepcontrol: sm_90 and later

    def _cuda_arch(builder) -> ir.Value:
        """__nvvm_reflect("__CUDA_ARCH"): the target's architecture x 10, a constant to libNVVM."""
        module = builder.module
        i8p = ir.IntType(8).as_pointer()
        reflect = module.globals.get("__nvvm_reflect")
        if reflect is None:
            reflect = ir.Function(module, ir.FunctionType(ir.IntType(32), [i8p]), "__nvvm_reflect")
        text = bytearray(b"__CUDA_ARCH\0")
        kind = ir.ArrayType(ir.IntType(8), len(text))
        name = module.get_unique_name("cuda_arch_name")
        string = ir.GlobalVariable(module, kind, name)
        string.initializer = ir.Constant(kind, text)
        string.global_constant = True
        string.linkage = "internal"
        return builder.call(reflect, [builder.bitcast(string, i8p)])

    @intrinsic
    def _griddepcontrol_wait(typingctx):
        def codegen(context, builder, signature, args):
            hopper = builder.icmp_signed(
                ">=", _cuda_arch(builder), ir.Constant(ir.IntType(32), MIN_ARCH)
            )
            with builder.if_then(hopper):
                fnty = ir.FunctionType(ir.VoidType(), [])
                builder.asm(fnty, "griddepcontrol.wait;", "~{memory}", [], side_effect=True)
            return context.get_dummy_value()

        return types.void(), codegen

    @device_function
    def grid_dependency_sync():
        """Wait until the grids this one depends on have completed and their writes are
        visible (returns at once when the launch had no programmatic dependency)."""
        _griddepcontrol_wait()
