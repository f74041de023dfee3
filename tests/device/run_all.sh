#!/usr/bin/env bash
# Issue 4's device proof in one call, from the repo root on the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; \
#   bash tests/device/run_all.sh
# (1) the kernel tests on the real GPU, (2) ceilings, per-kernel times and full-size kernels vs
# their numpy twins, (3) whole-model logits vs numpy and transformers, greedy agreement, batch
# invariance, eager speed, (4) compute-sanitizer memcheck over a few steps. Writes under $OUT:
# kernel_tests.log, check_kernels.json, check_model.json, sanitizer.log, run_all.log,
# summary.txt, and prints the summary table last. Each part has a time limit (seconds: the
# device tool gives one command 600), and a part that fails does not stop the others.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tinychat-device-out}
export OUT
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import numpy, numba, numba_cuda; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__)"
  echo "== kernel tests on the GPU (TINYCHAT_CUDA_DEBUG: synchronise and check after every op)"
  TINYCHAT_CUDA_DEBUG=1 timeout "${T_TESTS:-170}" python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernels_*.py 2>&1 | tee "$OUT/kernel_tests.log"
  echo "== kernels: ceilings, timings, full-size checks"
  timeout "${T_KERNELS:-140}" python3 tests/device/check_kernels.py
  echo "== whole model, batch invariance, eager speed"
  timeout "${T_MODEL:-200}" python3 tests/device/check_model.py ${MODELS:-smollm2-135m llama-3.2-1b}
  echo "== compute-sanitizer memcheck ($SANITIZER)"
  timeout "${T_SANITIZER:-60}" "$SANITIZER" --tool memcheck --leak-check no --print-limit 20 \
    python3 tests/device/sanitize_decode.py > "$OUT/sanitizer.log" 2>&1
  tail -5 "$OUT/sanitizer.log"
} 2>&1 | tee "$OUT/run_all.log"
python3 tests/device/summary.py
