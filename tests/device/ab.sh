#!/usr/bin/env bash
# A/B on the GPU machine: run one command under several environment settings, one process each
# (the kernels' knobs are read at import), output under $OUT/ab_<label>.log, tails printed.
#   bash tests/device/ab.sh "python3 tests/device/bench_kernels.py" \
#     base:TINYCHAT_DECODE_PIPELINE=0 pipe:TINYCHAT_DECODE_PIPELINE=1 \
#     pipe3:TINYCHAT_DECODE_PIPELINE=1,TINYCHAT_DECODE_BLOCKS_PER_SM=3
# Each variant is label:VAR=value[,VAR=value...]; T_AB (seconds, default 120) limits each run,
# TAIL (default 14) the lines printed.
set -uo pipefail
OUT=${OUT:-/tmp/tinychat-device-out}
mkdir -p "$OUT"
command=$1
shift
for variant in "$@"; do
  label=${variant%%:*}
  settings=${variant#*:}
  echo "== $label ($settings): $command"
  (
    IFS=',' read -ra pairs <<< "$settings"
    for pair in "${pairs[@]}"; do [ -n "$pair" ] && export "${pair?}"; done
    export OUT="$OUT/$label"
    mkdir -p "$OUT"
    timeout "${T_AB:-120}" bash -c "$command"
  ) > "$OUT/ab_$label.log" 2>&1
  tail -"${TAIL:-14}" "$OUT/ab_$label.log"
done
