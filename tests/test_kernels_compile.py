"""Every kernel compiles to PTX for sm_90 (the H200), with no GPU and no simulator.

The simulator has no compiler, so this runs in a subprocess with NUMBA_ENABLE_CUDASIM=0, using
each kernel module's SIGNATURES (the argument types the backend launches it with). Numba
compiles a kernel's device functions for the current device's compute capability and there is
no device here, so the subprocess tells it the device is a 9.0. The kernels use no bf16
intrinsics (the shim in gpu/kernels/bf16.py is integer arithmetic), so no LTO link is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu.backends.cuda.graphs import waits_for_predecessor

# The modules in three groups of similar compile time, a subprocess each, so that two workers
# share them: one process for all took 60-73 s on the 2-core CI host (attention_prefill 20 s,
# sampling 11, gemv 9, attention_decode 9, gemv_mma 5, the rest 6 together).
GROUPS = {
    "prefill": ["gpu.kernels.attention_prefill", "gpu.kernels.attention_prefill_split"],
    "decode": ["gpu.kernels.gemv", "gpu.kernels.attention_decode", "gpu.kernels.gemv_mma"],
    "rest": [
        "gpu.kernels.embedding",
        "gpu.kernels.rmsnorm",
        "gpu.kernels.rope_kv",
        "gpu.kernels.activation",
        "gpu.kernels.sampling",
        "gpu.kernels.argmax",
        "gpu.kernels.mma",
    ],
}
MODULES = [module for modules in GROUPS.values() for module in modules]

SCRIPT = textwrap.dedent(
    """
    import importlib, json, sys, time, types
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    # Device functions are compiled for the current device: say it is an sm_90.
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    results = {}
    for name in sys.argv[1:]:
        module = importlib.import_module(name)
        for kernel, signatures in module.SIGNATURES.items():
            for sig in signatures:
                start = time.perf_counter()
                ptx, _ = cuda.compile_ptx(getattr(module, kernel).py_func, sig, cc=(9, 0))
                entry = ptx.split(".entry ", 1)[1].split("(", 1)[0].strip()
                results[f"{name}.{kernel}"] = {
                    "seconds": round(time.perf_counter() - start, 2),
                    "sm_90": ".target sm_90" in ptx,
                    "lines": ptx.count("\\n"),
                    "entry": entry,
                    "waits": ptx.count("griddepcontrol.wait;"),
                }
    print(json.dumps(results))
    """
)


def test_the_groups_hold_every_kernel_module():
    """Every module of gpu/kernels with SIGNATURES is compiled by one group (token_state's
    kernel by test_sampler_state's own compile test)."""
    import gpu.kernels

    kernels = Path(gpu.kernels.__file__).parent
    with_signatures = {
        f"gpu.kernels.{f.stem}" for f in kernels.glob("*.py") if "\nSIGNATURES" in f.read_text()
    }
    assert len(MODULES) == len(set(MODULES))
    assert with_signatures - {"gpu.kernels.token_state"} == set(MODULES)


@pytest.mark.parametrize("group", GROUPS)
def test_every_kernel_compiles_for_sm90(group):
    pytest.importorskip("numba.cuda")
    modules = GROUPS[group]
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *modules],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {
        f"{m}.{k}" for m in modules for k in __import__(m, fromlist=["SIGNATURES"]).SIGNATURES
    }
    assert set(results) == expected
    assert all(r["sm_90"] for r in results.values()), results
    # Programmatic dependent launch (gpu/kernels/pdl.py): the graphs start a kernel early only
    # if it is recognised as ours by name, and each of ours must wait for its predecessor.
    for name, r in results.items():
        assert waits_for_predecessor(r["entry"].encode()), (name, r["entry"])
        assert r["waits"] >= 1, name


PRE_HOPPER = textwrap.dedent(
    """
    import types
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(8, 0))
    from gpu.kernels import gemv

    name = "gemv_qkv_llama32"
    ptx, _ = cuda.compile_ptx(
        getattr(gemv, name).py_func, gemv.SIGNATURES[name][0], cc=(8, 0)
    )
    print(".target sm_80" in ptx, "griddepcontrol" in ptx)
    """
)


def test_pre_hopper_builds_leave_out_the_wait():
    """griddepcontrol exists from sm_90 on: an A100 (sm_80) build must not contain it (pdl.py
    guards it with __nvvm_reflect("__CUDA_ARCH"))."""
    pytest.importorskip("numba.cuda")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", PRE_HOPPER], cwd=root, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split()[-2:] == ["True", "False"]
