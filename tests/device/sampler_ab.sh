#!/usr/bin/env bash
# The sampler's device proof and A/B in one call: the sampler's GPU tests on the new tree, then
# bench_sampling.py (the sampler alone, per-pass breakdown at batch 256) and sampling_table.py
# (the engine loop, every setting beside greedy) on both trees, one process per tree
# (ab_trees.sh). From the repo root on the GPU machine:
#   (here)  rm -rf snap_base snap_new && mkdir snap_base snap_new \
#             && git archive BASE | tar -x -C snap_base && git archive NEW | tar -x -C snap_new
#   (there) <the wheel install line>; bash snap_new/tests/device/sampler_ab.sh snap_base snap_new
# (carry: .whl snap_base snap_new). Writes under $OUT/<tree>/ (bench_sampling*.json,
# sampling_table*.json), $OUT/sampler_tests.log, $OUT/ab_bench_<tree>.log and
# $OUT/ab_<tree>.log (the table's). TABLE_BATCHES and
# TABLE_SETTINGS narrow the table (defaults: batches 64,256, every setting, Llama-3.2-1B).
set -uo pipefail
OUT=${OUT:-/tmp/tinychat-device-out}
export OUT
mkdir -p "$OUT"
base=$1
new=$2
here=$(dirname "$0")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== the sampler's GPU tests ($new)"
(
  cd "$new" && PYTHONPATH="/tmp/site:$PWD" timeout "${T_TESTS:-200}" python3 -m pytest -q \
    -p no:cacheprovider tests/test_kernels_sampling.py tests/test_sampler_state.py \
    tests/test_cuda_graphs_sampling.py
) > "$OUT/sampler_tests.log" 2>&1
tail -3 "$OUT/sampler_tests.log"
T_AB=${T_BENCH:-120} TAIL=12 bash "$here/ab_trees.sh" \
  "python3 tests/device/bench_sampling.py --std 1.3 --batches 64,256 --vocabs 128256 --breakdown-batches 256" \
  "$base" "$new"
for tree in "$base" "$new"; do mv "$OUT/ab_$tree.log" "$OUT/ab_bench_$tree.log"; done
T_AB=${T_TABLE:-150} TAIL=14 bash "$here/ab_trees.sh" \
  "python3 tests/device/sampling_table.py --config llama-3.2-1b --batches ${TABLE_BATCHES:-64,256} --new-tokens 128 ${TABLE_SETTINGS:+--settings $TABLE_SETTINGS}" \
  "$new" "$base"
