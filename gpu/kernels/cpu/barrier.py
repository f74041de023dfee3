"""A barrier between the threads of one Numba parallel region, for the fused decode step.

Numba has no CPU atomics, so the few this needs (an atomic add, load, store and compare-and-swap
on an int64 array element, the x86 `pause`, the cycle counter and `sched_yield`) are written as
LLVM IR, as prefetch.py and int16_dots.py write theirs. The barrier is sense-reversing: the last
thread to arrive resets the count and flips the shared sense; the others wait for the flip,
first with `pause` for SPINS rounds (a partner a few microseconds late: the usual case), then
with `sched_yield`, so that a partner the OS took off its core (a busy host) costs a yield loop
that leaves the core to whoever wants it rather than a spinning one.

`check_in` is the region's first barrier, and the only one that can give up: if the partners
have not all arrived within a timeout (a schedule that ran two shares on one thread would wait
forever), every share learns that the step is off before any of them wrote anything.

State: an int64 array of STATE_SIZE, zeroed before the region (`new_state`); each counter on a
cache line of its own.
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding as ll
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

COUNT, SENSE, ARRIVED, GO = 0, 8, 16, 24  # int64 indices, 64 bytes apart
STATE_SIZE = 32
SPINS = 2000  # pause rounds before yielding: ~20-50 us (a pause is 10-40 ns)
_I32, _I64 = ir.IntType(32), ir.IntType(64)
_X86 = ll.get_process_triple().startswith(("x86_64", "i686", "i386"))


def new_state() -> np.ndarray:
    return np.zeros(STATE_SIZE, np.int64)


def _element(context, builder, array_type, array, index):
    a = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, a, [index], wraparound=False)


def _is_int64_vector(array) -> bool:
    return isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.int64


@intrinsic
def atomic_add(typingctx, array, index, value):
    """array[index] += value atomically; returns the old value."""
    if not _is_int64_vector(array):
        return None

    def codegen(context, builder, sig, args):
        p = _element(context, builder, sig.args[0], args[0], args[1])
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", p, v, "seq_cst")

    return types.int64(array, index, value), codegen


@intrinsic
def atomic_load(typingctx, array, index):
    if not _is_int64_vector(array):
        return None

    def codegen(context, builder, sig, args):
        p = _element(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(p, "seq_cst", 8)

    return types.int64(array, index), codegen


@intrinsic
def atomic_store(typingctx, array, index, value):
    if not _is_int64_vector(array):
        return None

    def codegen(context, builder, sig, args):
        p = _element(context, builder, sig.args[0], args[0], args[1])
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(v, p, "seq_cst", 8)
        return context.get_dummy_value()

    return types.none(array, index, value), codegen


@intrinsic
def atomic_cas(typingctx, array, index, expected, value):
    """array[index] = value if it holds `expected`; returns True if it did."""
    if not _is_int64_vector(array):
        return None

    def codegen(context, builder, sig, args):
        p = _element(context, builder, sig.args[0], args[0], args[1])
        old = context.cast(builder, args[2], sig.args[2], types.int64)
        new = context.cast(builder, args[3], sig.args[3], types.int64)
        pair = builder.cmpxchg(p, old, new, "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return types.boolean(array, index, expected, value), codegen


@intrinsic
def cpu_pause(typingctx):
    """x86 `pause` (a spinning thread's hint to the core); nothing elsewhere."""

    def codegen(context, builder, sig, args):
        if _X86:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"
            )
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (x86 rdtsc): a clock for timeouts, not for measurements."""

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I64, []), "llvm.readcyclecounter"
        )
        return builder.call(fn, [])

    return types.int64(), codegen


@intrinsic
def sched_yield(typingctx):
    """libc's sched_yield(): give the core to another runnable thread, if there is one. A
    symbol of the process (no ctypes pointer: the function stays cacheable)."""

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, []), "sched_yield"
        )
        return builder.call(fn, [])

    return types.int32(), codegen


@njit(fastmath=False, cache=True, nogil=True, error_model="numpy")
def barrier_wait(state, n_threads, sense):  # pragma: no cover - compiled
    """Wait until all n_threads threads have called it; `sense` is the caller's own (0 at the
    region's start), and the return value its next."""
    sense = 1 - sense
    if atomic_add(state, COUNT, 1) == n_threads - 1:
        atomic_store(state, COUNT, 0)
        atomic_store(state, SENSE, sense)
    else:
        spins = 0
        while atomic_load(state, SENSE) != sense:
            if spins < SPINS:
                cpu_pause()
                spins += 1
            else:
                sched_yield()
    return sense


@njit(fastmath=False, cache=True, nogil=True, error_model="numpy")
def check_in(state, n_threads, timeout_cycles):  # pragma: no cover - compiled
    """The region's first barrier: True when all n_threads arrived, False (for every one of
    them, however late) when the first to wait gave up after timeout_cycles."""
    if atomic_add(state, ARRIVED, 1) == n_threads - 1:
        atomic_cas(state, GO, 0, 1)  # all here, unless a waiter already called it off
    else:
        start = cycles()
        spins = 0
        while atomic_load(state, GO) == 0:
            if spins < SPINS:
                cpu_pause()
                spins += 1
            else:
                sched_yield()
                if cycles() - start > timeout_cycles:
                    atomic_cas(state, GO, 0, -1)
    return atomic_load(state, GO) == 1
