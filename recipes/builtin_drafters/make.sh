#!/usr/bin/env bash
# The built-in drafters, end to end (rerunnable; every step resumes or skips
# what is done):
#   1. prompts from the stdlib corpus completed by the built-in target (2 shards
#      in parallel, one per core);
#   2. four drafters trained by `dflash2 train` with the same backbone, data and
#      steps, each data-parallel over both cores (--processes 2: mlx.launch, ring):
#      DFlash (baseline), DFlash 2, and the seed's two ablations;
#   3. `dflash2 analyze` on the held-out completions -> benchmarks/results/analyze-builtin/;
#   4. the DFlash 2 and DFlash drafters installed into dflash2_mlx/builtin/ with a
#      TRAINING.md each (tokens, time, held-out numbers, read from the run).
# Knobs: STEPS, LR, PROCESSES, LAYERS, BLOCK, BATCH, SEQ, PER_FILE, RANK (selector rank; 64 keeps the
# selector proportionate to a 4k-vocabulary, 192-wide drafter), VARIANTS (environment).
# BLAS_SHIM=1 routes MLX's CPU matmuls to numpy's OpenBLAS for these long jobs
# (recipes/blas_shim; ~8x faster training here, never used for benchmarks).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${BLAS_SHIM:-0}" = 1 ]; then eval "$(bash recipes/blas_shim/build.sh)"; fi
VARIANTS=${VARIANTS:-"dflash dflash2 dflash-selector dflash-conv"}
MODEL=${MODEL:-builtin}  # another target folder only for trying the recipe; nothing is installed then
MODEL_PATH=$MODEL; [ "$MODEL" = builtin ] && MODEL_PATH=dflash2_mlx/builtin/target
RUN=${RUN:-runs/builtin_drafters}
STEPS=${STEPS:-1200}; LAYERS=${LAYERS:-2}; BLOCK=${BLOCK:-16}; BATCH=${BATCH:-16}; SEQ=${SEQ:-256}
PER_FILE=${PER_FILE:-2}
mkdir -p "$RUN"

if [ ! -f "$RUN/data/train-1.jsonl" ]; then
  python recipes/builtin_drafters/make_data.py "$RUN/data" --model "$MODEL_PATH" --shard 0 --shards 2 --per-file "$PER_FILE" &
  python recipes/builtin_drafters/make_data.py "$RUN/data" --model "$MODEL_PATH" --shard 1 --shards 2 --per-file "$PER_FILE"
  wait
fi
# More held-out prompts for the analysis (same held-out modules, other positions).
if [ ! -f "$RUN/heldout/heldout-1.jsonl" ]; then
  for s in 0 1; do
    python recipes/builtin_drafters/make_data.py "$RUN/heldout" --model "$MODEL_PATH" --shard $s --shards 2 --per-file "$PER_FILE" \
      --splits heldout --heldout-per-file "${HELDOUT_PER_FILE:-6}" --seed 7 &
  done
  wait
fi

train() {  # name, kind, trainable
  dflash2 train --processes "${PROCESSES:-2}" --model "$MODEL" \
    --data "$RUN/data/train-0.jsonl" --data "$RUN/data/train-1.jsonl" --out "$RUN/$1" \
    --kind "$2" --train "$3" --layers "$LAYERS" --block-size "$BLOCK" --batch-size "$BATCH" \
    --seq-len "$SEQ" --steps "$STEPS" --lr "${LR:-2e-3}" --selector-rank "${RANK:-64}" \
    --eval-every "${EVAL_EVERY:-200}" --save-every "${SAVE_EVERY:-100}" --seed 0 2>&1 | tee -a "$RUN/$1.log"
  [ -f "$RUN/$1/drafter/model.safetensors" ] || { echo "training $1 failed: see $RUN/$1.log" >&2; exit 1; }
}
for v in $VARIANTS; do
  case $v in
    dflash) train dflash dflash all ;;
    dflash2) train dflash2 dflash2 all ;;
    dflash-selector) train dflash-selector dflash2 no-conv ;;
    dflash-conv) train dflash-conv dflash2 no-selector ;;
  esac
done

unset LD_PRELOAD  # the analysis times cycles: stock MLX only
[ -d "$RUN/dflash-selector/drafter" ] && [ -d "$RUN/dflash-conv/drafter" ] && dflash2 analyze --model "$MODEL" --data "$RUN/data/heldout-0.jsonl" --data "$RUN/data/heldout-1.jsonl" \
  --data "$RUN/heldout/heldout-0.jsonl" --data "$RUN/heldout/heldout-1.jsonl" ${ANALYZE_ARGS:---prompts 32 --prompt-len 48 --max-tokens 64} \
  --heldout-fraction 1.0 --out "${ANALYSIS:-benchmarks/results/analyze-builtin}" --block-size "${ANALYZE_BLOCK:-$BLOCK}" \
  --dflash "$RUN/dflash/drafter" --selector "$RUN/dflash-selector/drafter" \
  --conv "$RUN/dflash-conv/drafter" --dflash2 "$RUN/dflash2/drafter"

for v in dflash2 dflash; do
  if [ "$MODEL" = builtin ] && [ -d "$RUN/$v/drafter" ]; then
    rm -rf "dflash2_mlx/builtin/$v" && cp -r "$RUN/$v/drafter" "dflash2_mlx/builtin/$v"
    python recipes/builtin_drafters/training_md.py "$RUN" "$v" "dflash2_mlx/builtin/$v" --seq-len "$SEQ"
  fi
done
