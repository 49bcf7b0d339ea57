#!/usr/bin/env bash
# SmolLM2-135M-Instruct's drafters, end to end (rerunnable; every step resumes or skips what is done):
#   1. instruction prompts assembled offline (prompts.py: code, chat, maths; held-out topics apart);
#   2. SmolLM2 answers them itself (make_data.py, 2 shards in parallel, one per core), the first
#      LIMIT prompts of each shard;
#   3. DFlash 2 and the DFlash (v1) baseline trained by `dflash2 train` with the same backbone,
#      data and steps (--processes 2: two ring ranks), sharing one --feature-store: the frozen
#      target's features of each sequence are computed once, in DFlash 2's first epoch;
#   4. both quantized to 8 bits and installed into dflash2_mlx/builtin/smollm2-{dflash2,dflash} with a
#      TRAINING.md each.
# Knobs (environment): STEPS, LR, LAYERS, TARGET_LAYERS, BLOCK, BATCH, SEQ, BPS (blocks per
# sequence), RANK (selector rank: 32 keeps the 49k-row codebooks, and the file, under 20 MB), LIMIT.
# BLAS_SHIM=1 (default here) routes MLX's CPU matmuls to numpy's OpenBLAS (recipes/blas_shim).
# STAGES (default data,drafters,install): add `ablations` for the seed's two ablation drafters,
# DFlash + selector (--train no-conv) and DFlash + conv (--train no-selector), same data and steps,
# into $RUN/dflash-selector and $RUN/dflash-conv (for `dflash2 analyze`; not shipped).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${BLAS_SHIM:-1}" = 1 ]; then eval "$(bash recipes/blas_shim/build.sh)"; fi
RUN=${RUN:-runs/smollm2}
STEPS=${STEPS:-720}; LAYERS=${LAYERS:-3}; TARGET_LAYERS=${TARGET_LAYERS:-1,8,15,22,28}
BLOCK=${BLOCK:-16}; BATCH=${BATCH:-8}; SEQ=${SEQ:-256}; BPS=${BPS:-8}; RANK=${RANK:-32}
LIMIT=${LIMIT:-480}; STAGES=${STAGES:-data,drafters,install}
mkdir -p "$RUN/data"
stage() { [[ ",$STAGES," == *",$1,"* ]]; }

[ -f "$RUN/prompts/train.jsonl" ] || python recipes/smollm2_drafters/prompts.py "$RUN/prompts"
if stage data && [ ! -f "$RUN/data/train-1.jsonl" ]; then
  for s in 0 1; do
    python recipes/smollm2_drafters/make_data.py "$RUN/prompts/train.jsonl" "$RUN/data/train-$s.jsonl" \
      --shard $s --shards 2 --batch 96 --limit "$LIMIT" 2>>"$RUN/data-$s.log" &
  done
  wait
fi

train() {  # name, kind, more `dflash2 train` flags
  dflash2 train --processes 2 --model smollm2 "${@:3}" \
    --data "$RUN/data/train-0.jsonl" --data "$RUN/data/train-1.jsonl" --out "$RUN/$1" --kind "$2" \
    --layers "$LAYERS" --target-layers "$TARGET_LAYERS" --block-size "$BLOCK" --batch-size "$BATCH" \
    --blocks-per-seq "$BPS" --seq-len "$SEQ" --steps "$STEPS" --lr "${LR:-1e-3}" --selector-rank "$RANK" \
    --feature-store "$RUN/features" --eval-every "${EVAL_EVERY:-60}" --save-every "${SAVE_EVERY:-30}" --seed 0 \
    2>&1 | tee -a "$RUN/$1.log"
  [ -f "$RUN/$1/drafter/model.safetensors" ] || { echo "training $1 failed: see $RUN/$1.log" >&2; exit 1; }
}
if stage drafters; then
  train dflash2 dflash2
  train dflash dflash
fi
if stage ablations; then
  train dflash-selector dflash2 --train no-conv
  train dflash-conv dflash2 --train no-selector
fi

# Installed 8-bit (w8abf16, groups of 64): three bfloat16 layers make a 32 MB file, over the package's
# 20 MB a file; 8-bit layers and projection keep each under it (the selector codebooks stay bfloat16).
# τ is measured on these installed files (benchmarks/real_pair_tau.py).
if stage install; then for v in dflash2 dflash; do
  rm -rf "$RUN/$v/drafter-q8" && dflash2 quantize --drafter "$RUN/$v/drafter" -q w8abf16:gs64 -o "$RUN/$v/drafter-q8"
  rm -rf "dflash2_mlx/builtin/smollm2-$v" && cp -r "$RUN/$v/drafter-q8" "dflash2_mlx/builtin/smollm2-$v"
  python recipes/builtin_drafters/training_md.py "$RUN" "$v" "dflash2_mlx/builtin/smollm2-$v" --seq-len "$SEQ" \
    --title "SmolLM2-135M-Instruct $v drafter" --about recipes/smollm2_drafters/about.md
done; fi
