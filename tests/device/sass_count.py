"""Instructions of a kernel's hottest loop on sm_90, without a GPU (the counts in the kernels'
docstrings and BENCHMARKS.md come from here).

Compiles one kernel of a gpu/kernels module to PTX for compute capability 9.0 (its SIGNATURES
entry, its launch bounds), assembles it with the ptxas of the nvidia-cuda-nvcc wheel, and
disassembles it with nvdisasm, which no runtime dependency carries: fetch it once with
`pip download --no-deps nvidia-cuda-nvdisasm` and unzip the wheel. Prints the registers and
spills, then the loop (backward branch) with the most HMMA, else FFMA, instructions: its length
and its instruction mix.

    NUMBA_ENABLE_CUDASIM=0 python tests/device/sass_count.py gpu.kernels.attention_decode \\
        decode_kernel_llama32 --ptxas .../nvidia/cu13/bin/ptxas --nvdisasm .../bin/nvdisasm
"""

from __future__ import annotations

import argparse
import collections
import importlib
import re
import subprocess
import tempfile
import types
from pathlib import Path

OP = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9_]+)")
BRANCH = re.compile(r"BRA `\((\.L_x_\d+)\)")


def hottest_loop(sass: str) -> collections.Counter:
    """The instruction mix of the backward-branch loop with the most HMMA, then FFMA."""
    lines = sass.splitlines()
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if line.startswith(".L")}
    best: collections.Counter = collections.Counter()
    for i, line in enumerate(lines):
        m = BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            ops = collections.Counter(
                op.group(1) for op in map(OP.match, lines[labels[m.group(1)] : i + 1]) if op
            )
            if (ops["HMMA"], ops["FFMA"]) > (best["HMMA"], best["FFMA"]):
                best = ops
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("module")
    p.add_argument("kernel")
    p.add_argument("--ptxas", required=True)
    p.add_argument("--nvdisasm", required=True)
    p.add_argument("--dump", default=None, help="also write the whole SASS to this file")
    args = p.parse_args()
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    # Device functions are compiled for the current device: say it is an sm_90.
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    module = importlib.import_module(args.module)
    kernel = getattr(module, args.kernel)
    bounds = kernel.targetoptions.get("launch_bounds")
    ptx, _ = cuda.compile_ptx(
        kernel.py_func, module.SIGNATURES[args.kernel][0], cc=(9, 0),
        **({"launch_bounds": bounds} if bounds else {}),
    )  # fmt: skip
    work = Path(tempfile.mkdtemp())
    (work / "k.ptx").write_text(ptx)
    cubin = str(work / "k.cubin")
    report = subprocess.run(
        [args.ptxas, "-arch=sm_90", "-v", str(work / "k.ptx"), "-o", cubin],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    print("\n".join(line for line in report.splitlines() if "registers" in line or "spill" in line))
    sass = subprocess.run(
        [args.nvdisasm, "-c", cubin], capture_output=True, text=True, check=True
    ).stdout
    if args.dump:
        Path(args.dump).write_text(sass)
    loop = hottest_loop(sass)
    print(f"hottest loop: {sum(loop.values())} instructions")
    print(", ".join(f"{op} {n}" for op, n in loop.most_common()))


if __name__ == "__main__":
    main()
