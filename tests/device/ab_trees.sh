#!/usr/bin/env bash
# A/B of two source trees on the GPU machine: the same command in each, one process per tree,
# so a change is measured against the code before it in one device call.
#   (here)  rm -rf snap snap_base && mkdir snap snap_base && git archive HEAD | tar -x -C snap \
#             && git archive BASE_COMMIT | tar -x -C snap_base      (carry: .whl snap snap_base)
#   (there) <the wheel install line>; bash snap/tests/device/ab_trees.sh \
#             "python3 tests/device/bench_kernels.py" snap_base snap
# Each tree runs from its own root with PYTHONPATH=/tmp/site:<tree> (the Numba kernel cache is
# per tree: each compiles its own kernels); its output goes under $OUT/<tree>/ and to
# $OUT/ab_<tree>.log, whose last TAIL lines (default 20) are printed. T_AB (seconds, default
# 150) limits each run. More than two trees may be given.
set -uo pipefail
OUT=${OUT:-/tmp/tinychat-device-out}
mkdir -p "$OUT"
root=$PWD
command=$1
shift
for tree in "$@"; do
  echo "== $tree: $command"
  (
    cd "$root/$tree" || exit 1
    export PYTHONPATH="/tmp/site:$root/$tree"
    export OUT="$OUT/$tree"
    mkdir -p "$OUT"
    timeout "${T_AB:-150}" bash -c "$command"
  ) > "$OUT/ab_$tree.log" 2>&1
  tail -"${TAIL:-20}" "$OUT/ab_$tree.log"
done
