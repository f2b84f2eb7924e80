#!/bin/bash
# The accelerator checks of the checkpoint and throughput work, as one command for a lent GPU
# machine (python3 with jax+CUDA, optax, tensorstore; no TensorFlow, no network). Each part has a
# time limit and the whole stops by DEADLINE (560 s, about 9.5 minutes); results go to $OUT
# (default ./gpu_checks).
#
#   bash benchmarks/gpu_checks.sh                  # run from the repository root
#   GPU_CHECKS_TINY=1 bash benchmarks/gpu_checks.sh  # every part with --tiny (loss chunk 16), on
#                                                  # CPU: checks the script's logic (3-4
#                                                  # minutes on 2 cores); its numbers mean nothing
#
# The parts, most important numbers first (issue 41's acceptance order); a part's limit is cut to
# what is left of DEADLINE, so a slow early part takes its time from the later ones:
# 1. save50 (190 s): honeycrisp_1b --save_every 50: blocking per save, non-save steps (median and
#    mean) with and without saves.
# 2. sweep (330 s): gpu_sweep --fp8 at batch 16 and 32 with remat save_matmuls and the chunked
#    loss (batch 16 without remat does not fit an H100); the fastest cell against plain JAX and
#    against itself with fp8 matmuls, alternating in one round (fp8_vs_bf16: tokens/s ratio,
#    losses of both over the measured steps, fp8 peak memory). --budget_s keeps the sweep inside
#    its limit, so its JSON is always printed (a run left without time is reported as skipped).
# 3. save5 (110 s): --save_every 5: the disk cannot keep up, the log says so.
# 4. trace (170 s, mostly only what is left): the batch-8 cell (no remat, chunked loss) with the
#    flag sets none and llm_recipe, each with a 3-step profiler trace gzipped into $OUT (read it
#    with `python benchmarks/trace_summary.py` on any machine).
# summary.txt gets each part's exit status and time, the checkpoint log lines, and the headline
# numbers (benchmarks/gpu_checks_summary.py); it is printed at the end. Logs (*.err) come back as
# logs.tgz (at most 8 files come back from the machine: 4 JSONs, 2 traces, summary, logs).
set -u
OUT=${OUT:-$PWD/gpu_checks}
mkdir -p "$OUT"
# A rerun into the same $OUT starts afresh (only this script's own files are removed).
for part in save50 sweep save5 trace; do rm -f "$OUT/$part.json" "$OUT/$part.err"; done
rm -f "$OUT"/trace_*.xplane.pb.gz "$OUT/logs.tgz"
: > "$OUT/summary.txt"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# One compilation per program across the runs below.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/axlearn_jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
DEADLINE=${DEADLINE:-560}
TINY="" CHUNK=1024
# The tiny model's sequence is 64 tokens: its loss chunk is 16 (plain JAX needs chunk <= seq).
if [ "${GPU_CHECKS_TINY:-0}" = 1 ]; then TINY=--tiny CHUNK=16; fi
left() { local t=$((DEADLINE - SECONDS)); if [ "$t" -gt "$1" ]; then echo "$1"; else echo "$t"; fi; }
run() {  # name limit_s command... (an argument @BUDGET@ becomes the limit less 15 s)
  local name=$1 limit
  limit=$(left "$2")
  shift 2
  if [ "$limit" -le 10 ]; then echo "$name: skipped (no time left)" >> "$OUT/summary.txt"; return; fi
  timeout "$limit" "${@//@BUDGET@/$((limit - 15))}" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name: exit $? at ${SECONDS}s (limit ${limit}s)" >> "$OUT/summary.txt"
}
run save50 190 python3 benchmarks/honeycrisp_1b.py $TINY --steps 105 --save_every 50
run sweep 330 python3 benchmarks/gpu_sweep.py $TINY --batches 16,32 --remats save_matmuls \
  --chunks "$CHUNK" --flag_sets none --steps 15 --rounds 1 --fp8 --timeout_s 100 --budget_s @BUDGET@
run save5 110 python3 benchmarks/honeycrisp_1b.py $TINY --steps 13 --save_every 5
run trace 170 python3 benchmarks/gpu_sweep.py $TINY --batches 8 --remats none \
  --chunks "$CHUNK" --flag_sets none,llm_recipe --steps 15 --rounds 0 --timeout_s 85 \
  --budget_s @BUDGET@ --trace_dir "$OUT"
# The snapshot choice and the pinned-memory set-up at start, as the runs logged them.
grep -h "checkpoint snapshot: \|set up at start\|pinned host memory" "$OUT"/save*.err 2>/dev/null \
  | cut -c1-300 | sort | uniq -c >> "$OUT/summary.txt"
python3 benchmarks/gpu_checks_summary.py "$OUT" >> "$OUT/summary.txt" 2>&1
# At most 8 files come back from the machine: the logs travel as one archive.
(cd "$OUT" && tar czf logs.tgz ./*.err && rm -f ./*.err)
cat "$OUT/summary.txt"
