#!/usr/bin/env bash
# SmolLM2-135M-Instruct's drafters, end to end. Rerunnable: every stage resumes or skips what is done,
# so after an interruption the same command goes on where it stopped. Run it in the background:
#   nohup bash recipes/smollm2_drafters/make.sh > runs/smollm2/make.log 2>&1 &
# Stages (STAGES, comma-separated; default all but ablations):
#   export     SmolLM2's GGUF weights as a transformers folder (export_hf.py), for the generator;
#   torch      the generator's own virtual environment ($RUN/torch-venv: PyTorch 2.13 CPU from this
#              machine's disk, transformers as the package's), outside the package's environment;
#   corpus     the prompt corpus (corpus.py: code, Debian packages, manual pages, maths, writing);
#   questions  SmolLM2 writes questions about seed subjects; corpus.py adds them as requests;
#   answers    SmolLM2 answers the corpus (make_data.py: bfloat16, batched; SHARDS processes, the
#              first LIMIT requests of each shard);
#   follow-ups second turns after the first FOLLOW answered rows of each shard;
#   drafters   DFlash 2 and the DFlash (v1) baseline trained by `dflash2 train` with the same backbone,
#              data and budget (--processes 2), sharing one --feature-store; each stops when the
#              held-out loss has not improved for PATIENCE evaluations (or at STEPS);
#   install    both quantized to 8 bits into dflash2_mlx/builtin/smollm2-{dflash2,dflash} with a
#              TRAINING.md each;
#   ablations  (not by default) the seed's two ablation drafters, for `dflash2 analyze`.
# Knobs (environment): RUN, SHARDS, LIMIT, FOLLOW, STEPS, PATIENCE, LR, LAYERS, TARGET_LAYERS, BLOCK, BATCH,
# SEQ, BPS (blocks per sequence), RANK (selector rank: 32 keeps the file under 20 MB), DRAFTERS (which of
# "dflash2 dflash" the drafters and install stages take: one per session where a session cannot fit both),
# INIT_FROM (a drafter folder each trained drafter starts from, e.g. an earlier run's RUN/KIND/drafter kept
# under another name: a later session lengthens the schedule instead of starting over; the store is reused).
# BLAS_SHIM=1 (default) routes MLX's CPU matmuls to numpy's OpenBLAS for training (recipes/blas_shim).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${BLAS_SHIM:-1}" = 1 ]; then eval "$(bash recipes/blas_shim/build.sh)"; fi
RUN=${RUN:-runs/smollm2}; HERE=recipes/smollm2_drafters; ANSWERS=${ANSWERS:-$HERE/answers}
# LIMIT: requests answered per shard. 13 groups of 768 (9,984 a shard, ~20k in all, ~4M answer tokens)
# take about 4.5 hours on this 2-core machine (~130 answer tokens/s a core); 0 answers all 47k (~10 h).
SHARDS=${SHARDS:-2}; LIMIT=${LIMIT:-9984}; FOLLOW=${FOLLOW:-1500}
STEPS=${STEPS:-12000}; PATIENCE=${PATIENCE:-3}; LAYERS=${LAYERS:-3}; TARGET_LAYERS=${TARGET_LAYERS:-1,8,15,22,28}
BLOCK=${BLOCK:-16}; BATCH=${BATCH:-8}; SEQ=${SEQ:-256}; BPS=${BPS:-8}; RANK=${RANK:-32}
DRAFTERS=${DRAFTERS:-dflash2 dflash}
STAGES=${STAGES:-export,torch,corpus,questions,answers,follow-ups,drafters,install}
mkdir -p "$RUN/data" "$RUN/prompts" "$ANSWERS"
stage() { [[ ",$STAGES," == *",$1,"* ]]; }
log() { echo "[$(date -u +%FT%TZ)] $*"; }
TORCH_PY="$RUN/torch-venv/bin/python"

if stage export && [ ! -f "$RUN/hf/model.safetensors" ]; then
  log "export"; python $HERE/export_hf.py "$RUN/hf"
fi
if stage torch && ! "$TORCH_PY" -c "import torch, transformers" 2>/dev/null; then
  log "torch environment"
  python -m venv "$RUN/torch-venv"
  # torch 2.13.0 is the CPU build on this machine's disk; transformers as the package's (mlx-lm's) own.
  "$RUN/torch-venv/bin/pip" install -q torch==2.13.0 "transformers==$(python -c 'import transformers; print(transformers.__version__)')" safetensors
fi

generate() {  # prompts, out name, more make_data.py flags: SHARDS processes, one core each
  for ((s = 0; s < SHARDS; s++)); do
    env -u LD_PRELOAD "$TORCH_PY" $HERE/make_data.py "$RUN/hf" "$1" "$ANSWERS/$2-$s" --shard $s --shards "$SHARDS" \
      "${@:3}" 2>>"$RUN/data/$2-$s.log" &
  done
  wait
}
whole() {  # out name [limit]: every shard's groups in $RUN/data/NAME-S.jsonl, once all are answered
  for ((s = 0; s < SHARDS; s++)); do
    python $HERE/groups.py "$ANSWERS/$1-$s" "$RUN/data/$1-$s.jsonl" --expect "${2:-0}" \
      || { log "$1 shard $s is not done: run this stage again"; exit 1; }
  done
}

# The corpus and the answers are kept in the repository (xz): a session's checkout is new, and
# the answers take hours, so each session goes on from the groups the last one committed.
if stage corpus && [ ! -f "$ANSWERS/prompts.jsonl.xz" ]; then
  log "corpus (first pass)"; (cd $HERE && python corpus.py "$OLDPWD/$RUN/prompts")
fi
if stage questions && [ ! -f "$ANSWERS/prompts.jsonl.xz" ]; then
  log "questions"; generate "$RUN/prompts/topics.jsonl" topics
  whole topics; cat "$RUN"/data/topics-*.jsonl > "$RUN/prompts/topics-answered.jsonl"
  (cd $HERE && python corpus.py "$OLDPWD/$RUN/prompts" --questions "$OLDPWD/$RUN/prompts/topics-answered.jsonl")
  xz -T1 -c "$RUN/prompts/train.jsonl" > "$ANSWERS/prompts.jsonl.xz"
  cp "$RUN/prompts/sources.json" "$ANSWERS/sources.json"
fi
if stage answers; then
  log "answers"; generate "$ANSWERS/prompts.jsonl.xz" train --limit "$LIMIT"
  whole train "$LIMIT"
fi
if stage follow-ups; then
  log "follow-ups"
  for ((s = 0; s < SHARDS; s++)); do
    env -u LD_PRELOAD "$TORCH_PY" $HERE/make_data.py "$RUN/hf" "$ANSWERS/train-$s" "$ANSWERS/follow-$s" \
      --follow-up "$FOLLOW" --seed $s 2>>"$RUN/data/follow-$s.log" &
  done
  wait
  whole follow "$FOLLOW"
fi

train() {  # name, kind, more `dflash2 train` flags
  shopt -s nullglob  # the follow-up files exist only when that stage ran
  data=(); for f in "$RUN"/data/train-*.jsonl "$RUN"/data/follow-*.jsonl; do data+=(--data "$f"); done
  init=(); [ -z "${INIT_FROM:-}" ] || init=(--init-from "$INIT_FROM")
  dflash2 train --processes 2 --model smollm2 "${init[@]}" "${@:3}" "${data[@]}" --out "$RUN/$1" --kind "$2" \
    --layers "$LAYERS" --target-layers "$TARGET_LAYERS" --block-size "$BLOCK" --batch-size "$BATCH" \
    --blocks-per-seq "$BPS" --seq-len "$SEQ" --steps "$STEPS" --lr "${LR:-1e-3}" --selector-rank "$RANK" \
    --feature-store "$RUN/features" --eval-every "${EVAL_EVERY:-250}" --save-every "${SAVE_EVERY:-50}" \
    --patience "$PATIENCE" --seed 0 2>&1 | tee -a "$RUN/$1.log"
  [ -f "$RUN/$1/drafter/model.safetensors" ] || { log "training $1 failed: see $RUN/$1.log"; exit 1; }
}
if stage drafters; then
  # Without the answers stage in this run, train on every committed group (a new checkout has no data/).
  if ! stage answers && [ ! -f "$RUN/data/train-0.jsonl" ]; then whole train; fi
  log "drafters"; for v in $DRAFTERS; do train "$v" "$v"; done
fi
if stage ablations; then
  train dflash-selector dflash2 --train no-conv
  train dflash-conv dflash2 --train no-selector
fi

# Installed 8-bit (w8abf16, groups of 64): three bfloat16 layers make a 32 MB file, over the package's
# 20 MB a file; 8-bit layers and projection keep each under it (the selector codebooks stay bfloat16).
# τ is measured on these installed files (benchmarks/acceptance/real_pair_tau.py).
if stage install; then for v in $DRAFTERS; do
  rm -rf "$RUN/$v/drafter-q8" && dflash2 quantize --drafter "$RUN/$v/drafter" -q w8abf16:gs64 -o "$RUN/$v/drafter-q8"
  rm -rf "dflash2_mlx/builtin/smollm2-$v" && cp -r "$RUN/$v/drafter-q8" "dflash2_mlx/builtin/smollm2-$v"
  python recipes/builtin_drafters/training_md.py "$RUN" "$v" "dflash2_mlx/builtin/smollm2-$v" --seq-len "$SEQ" \
    --title "SmolLM2-135M-Instruct $v drafter" --about $HERE/about.md
done; fi
log "done: $STAGES"
