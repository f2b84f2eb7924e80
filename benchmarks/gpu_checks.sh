#!/bin/bash
# The accelerator checks of the checkpoint and throughput work, as one command for a lent GPU
# machine (python3 with jax+CUDA, optax, tensorstore; no TensorFlow, no network). Each part has a
# time limit so that the whole fits in about 9.5 minutes; results go to $OUT (default ./gpu_checks).
#
#   bash benchmarks/gpu_checks.sh            # run from the repository root
#
# 1. honeycrisp_1b --save_every 50: blocking per save, non-save steps (median and mean) with and
#    without saves; 2. the batch-8 cell (no remat, chunked loss) with the flag sets none and
#    llm_recipe, each with a 3-step profiler trace gzipped into $OUT (read it with
#    `python benchmarks/trace_summary.py` on any machine); 3. gpu_sweep at
#    batch 16 and 32 with remat save_matmuls and the chunked loss (batch 16 without remat does
#    not fit an H100), the fastest against plain JAX; 4. --save_every 5: the disk cannot keep
#    up, the log says so. Logs (*.err) come back as logs.tgz.
set -u
OUT=${OUT:-$PWD/gpu_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# One compilation per program across the runs below.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/axlearn_jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
DEADLINE=${DEADLINE:-560}
left() { local t=$((DEADLINE - SECONDS)); if [ "$t" -gt "$1" ]; then echo "$1"; else echo "$t"; fi; }
run() {  # name limit_s command...
  local name=$1 limit
  limit=$(left "$2")
  shift 2
  if [ "$limit" -le 10 ]; then echo "$name: skipped (no time left)" >> "$OUT/summary.txt"; return; fi
  timeout "$limit" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name: exit $? at ${SECONDS}s" >> "$OUT/summary.txt"
}
run save50 190 python3 benchmarks/honeycrisp_1b.py --steps 105 --save_every 50
run trace 170 python3 benchmarks/gpu_sweep.py --batches 8 --remats none --chunks 1024 \
  --flag_sets none,llm_recipe --steps 15 --rounds 0 --timeout_s 85 --trace_dir "$OUT"
run sweep 200 python3 benchmarks/gpu_sweep.py --batches 16,32 --remats save_matmuls \
  --chunks 1024 --flag_sets none --steps 15 --rounds 1 --timeout_s 80
run save5 120 python3 benchmarks/honeycrisp_1b.py --steps 13 --save_every 5
# The snapshot choice and the pinned-memory set-up at start, as the runs logged them.
grep -h "checkpoint snapshot: \|set up at start\|pinned host memory" "$OUT"/save*.err 2>/dev/null \
  | cut -c1-300 | sort | uniq -c >> "$OUT/summary.txt"
# At most 8 files come back from the machine: the logs travel as one archive.
(cd "$OUT" && tar czf logs.tgz ./*.err && rm -f ./*.err)
cat "$OUT/summary.txt"
