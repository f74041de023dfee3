#!/usr/bin/env bash
# Issue 5's device run in one call, from the repo root on the GPU machine (after the wheel
# install line of run_all.sh): graph replay vs eager tokens, kernel microbenchmarks, and
# `tinychat bench` on the SmolLM2-135M and Llama-3.2-1B configs (random bf16 weights): latency
# and decode at batches 1, 8, 64, 256 with every sampling setting (--sampling all: each row
# beside greedy's), start-up cold and warm (`bench startup`), with transformers beside it when
# COMPARE=hf (then throughput and chat run in a process of their own, bench_llama_load.json).
# Writes under $OUT: speed.log, bench_*.json and the microbenchmarks' JSON; prints the bench
# tables last, each part's seconds after it. Each part has its own time limit.
# Knobs: MICRO (which microbenchmarks; MICRO=none for none), WORKLOADS, REQUESTS, COMPARE, SKIP_TABLE,
# SAMPLING (default all; e.g. greedy,chat), SKIP_TESTS, SKIP_EAGER, SKIP_SMOL, SKIP_STARTUP, SKIP_SERVE,
# BASELINE=1 (also latency + decode with the serial engine, --no-async-scheduling), T_* limits,
# SKIP_APP, APP_TABS (default "1 8": `bench app`, the real app headless against the engine
# alone and through the engine core; bench_app_<tabs>.json).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tinychat-device-out}
export OUT
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
BENCH="python3 -m chat_app.cli bench --device cuda"
SAMPLING=${SAMPLING:-all}
took() { echo "   ($(( SECONDS - $1 )) s)"; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  if [ -z "${SKIP_TESTS:-}" ]; then
    echo "== graph replay vs eager, the decode kernels vs their twins (pytest, on the GPU)"
    timeout "${T_GRAPHS:-240}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py \
      tests/test_async_scheduling.py tests/test_kernels_cuda_backend.py \
      tests/test_kernels_gemv.py tests/test_kernels_attention.py tests/test_kernels_sampling.py \
      tests/test_kernels_elementwise.py tests/test_kernels_mma.py tests/test_batch_invariant_gpu.py \
      2>&1 | tail -15
  fi
  for micro in ${MICRO:-bench_gemv bench_kernels bench_prefill}; do
    if [ -f "tests/device/$micro.py" ]; then
      echo "== $micro"
      timeout "${T_MICRO:-90}" python3 "tests/device/$micro.py" 2>&1 | tail -25
    fi
  done
  if [ -z "${SKIP_STARTUP:-}" ]; then
    for config in smollm2-135m llama-3.2-1b; do
      echo "== bench startup $config (cold: empty kernel cache; warm: the same cache again)"
      t=$SECONDS
      timeout "${T_STARTUP:-150}" $BENCH startup --config $config \
        --json "$OUT/bench_startup_$config.json" 2>&1 | tail -3
      took $t
    done
  fi
  # Issue 22's table: every sampling setting beside greedy through the engine, batches 1-256,
  # on both configurations (the JSON: $OUT/sampling_table_<config>.json).
  if [ -z "${SKIP_TABLE:-}" ]; then
    for config in llama-3.2-1b smollm2-135m; do
      echo "== sampling table $config (engine.step, 128 new tokens)"
      t=$SECONDS
      timeout "${T_TABLE:-200}" python3 tests/device/sampling_table.py --config $config \
        --batches 1,8,64,256 --new-tokens 128 2>&1 | tail -30
      took $t
    done
  fi
  # --sampling all: 7 settings x (latency + 4 batches) = 35 rows, plus the header lines.
  if [ -z "${SKIP_SMOL:-}" ]; then
    echo "== bench smollm2-135m, sampling $SAMPLING"
    t=$SECONDS
    timeout "${T_SMOL:-150}" $BENCH latency decode --config smollm2-135m --sampling "$SAMPLING" \
      --json "$OUT/bench_smollm2.json" 2>&1 | tail -48
    took $t
  fi
  if [ -n "${BASELINE:-}" ]; then
    echo "== bench llama-3.2-1b, the serial engine (no async scheduling, greedy)"
    timeout "${T_BASELINE:-110}" $BENCH latency decode --sampling greedy \
      --config llama-3.2-1b --capture-at-start --no-async-scheduling \
      --json "$OUT/bench_llama_baseline.json" 2>&1 | tail -9
  fi
  if [ -z "${SKIP_EAGER:-}" ]; then
    echo "== bench llama-3.2-1b, eager (latency only, greedy)"
    timeout "${T_EAGER:-90}" $BENCH latency --sampling greedy --config llama-3.2-1b \
      --enforce-eager --json "$OUT/bench_llama_eager.json" 2>&1 | tail -6
  fi
  # transformers (--compare) gets a process of its own, with the workloads it runs (latency,
  # decode): loading it and torch.compile take ~2 minutes, which ran the sixth session's
  # single process past its limit; the seventh session's split finished in ~4 minutes.
  all=${WORKLOADS:-latency decode throughput chat}
  load="" decode="$all"
  if [ -n "${COMPARE:-}" ]; then
    load=$(for w in $all; do case $w in throughput | chat) printf '%s ' "$w" ;; esac; done)
    decode=$(for w in $all; do case $w in latency | decode) printf '%s ' "$w" ;; esac; done)
  fi
  if [ -n "$load" ]; then
    echo "== bench llama-3.2-1b: $load(graphs captured at start)"
    t=$SECONDS
    timeout "${T_LOAD:-200}" $BENCH $load --config llama-3.2-1b --capture-at-start \
      --num-requests "${REQUESTS:-256}" --json "$OUT/bench_llama_load.json" 2>&1 | tail -8
    took $t
  fi
  if [ -n "$decode" ]; then
    echo "== bench llama-3.2-1b: $decode${COMPARE:+with $COMPARE }(graphs captured at start)," \
      "sampling $SAMPLING"
    t=$SECONDS
    timeout "${T_LLAMA:-330}" $BENCH $decode --config llama-3.2-1b --capture-at-start \
      --sampling "$SAMPLING" --num-requests "${REQUESTS:-256}" ${COMPARE:+--compare $COMPARE} \
      --plot "$OUT/decode.png" --json "$OUT/bench_llama.json" 2>&1 | tail -52
    took $t
  fi
  if [ -z "${SKIP_SERVE:-}" ]; then
    # Issue 26: 64 streaming HTTP clients of `tinychat serve` beside the engine client alone,
    # greedy and the app's defaults (target: >= 0.9x its output tok/s), then 256 seeded
    # streams each equal to its request run alone (no lost, duplicated or interleaved tokens;
    # the same tokens as alone needs the batch-invariant ops: EngineConfig.batch_invariant).
    # Needs the serve extra's wheels (the machine has none of them): tests/device/wheels.sh.
    echo "== bench serve llama-3.2-1b: ${CLIENTS:-64} HTTP clients vs the engine alone"
    t=$SECONDS
    timeout "${T_SERVE:-240}" $BENCH serve --config llama-3.2-1b --clients "${CLIENTS:-64}" \
      --new-tokens 512 --json "$OUT/bench_serve.json" 2>&1 | tail -9
    took $t
    echo "== bench serve --check --batch-invariant llama-3.2-1b: 256 seeded streams vs each alone"
    t=$SECONDS
    timeout "${T_SERVE_CHECK:-290}" $BENCH serve --config llama-3.2-1b --clients 256 --check \
      --batch-invariant --sampling greedy --new-tokens 128 \
      --json "$OUT/bench_serve_check.json" 2>&1 | tail -8
    took $t
  fi
  # Issue 23: the app's cost to the engine. The first run writes the random weights to a
  # folder (~2.5 GB, once) that the engine core and this process both load.
  if [ -z "${SKIP_APP:-}" ]; then
    for tabs in ${APP_TABS:-1 8}; do
      echo "== bench app llama-3.2-1b, $tabs tab(s), the app's sampling, 512 new tokens each"
      t=$SECONDS
      timeout "${T_APP:-240}" $BENCH app --config llama-3.2-1b --tabs "$tabs" --new-tokens 512 \
        --json "$OUT/bench_app_$tabs.json" 2>&1 | tail -7
      took $t
    done
  fi
} 2>&1 | tee "$OUT/speed.log"
