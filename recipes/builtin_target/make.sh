#!/usr/bin/env bash
# Build the built-in target model end to end; rerunning resumes where it stopped.
#
#   bash recipes/builtin_target/make.sh
#
# Env (all optional):
#   RUN=runs/builtin_target          work folder (gitignored): data, checkpoints, logs
#   OUT=dflash2_mlx/builtin/target   the shipped checkpoint
#   TRAIN_VENV=$RUN/venv-train       torch venv, kept apart from the package's venv
#   MLX_PY=python3                   a Python with mlx-lm, for verify.py
#   TOTAL_TOKENS=22000000            training budget; fixes the LR schedule at first launch
#   STOP_BY=<unix time>              checkpoint and stop early (the export then ships the last checkpoint)
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=recipes/builtin_target
RUN=${RUN:-runs/builtin_target}
OUT=${OUT:-dflash2_mlx/builtin/target}
TRAIN_VENV=${TRAIN_VENV:-$RUN/venv-train}
MLX_PY=${MLX_PY:-python3}
TOTAL_TOKENS=${TOTAL_TOKENS:-22000000}
mkdir -p "$RUN" "$OUT"
# Record each invocation; report.py copies this into TRAINING.md.
echo "TRAIN_VENV=$TRAIN_VENV MLX_PY=$MLX_PY TOTAL_TOKENS=$TOTAL_TOKENS${STOP_BY:+ STOP_BY=$STOP_BY} bash $HERE/make.sh" >> "$RUN/commands.txt"

# 1. Training venv: torch (CPU) stays out of the package's dependencies.
if [ ! -x "$TRAIN_VENV/bin/python" ]; then
  python3 -m venv "$TRAIN_VENV"
  "$TRAIN_VENV/bin/pip" install -q torch==2.13.0 transformers tokenizers safetensors numpy
fi
PY="$TRAIN_VENV/bin/python"

# 2-3. Corpus split and tokenizer; skipped once done so a resumed run keeps the
# exact token streams its checkpoint was trained on.
[ -f "$RUN/corpus.json" ] || "$PY" "$HERE/corpus.py" "$RUN/corpus.json"
[ -f "$RUN/train.npy" ] || "$PY" "$HERE/tokenizer.py" "$RUN"

# 4. Train (or resume). One thread, lowest priority: the machine is shared.
if [ ! -f "$RUN/final.json" ]; then
  OMP_NUM_THREADS=1 nice -n 19 "$PY" "$HERE/train.py" "$RUN" \
    --total-tokens "$TOTAL_TOKENS" ${STOP_BY:+--stop-by "$STOP_BY"}
fi

# 5. Export bf16 HF checkpoint + tokenizer; check it in transformers and save reference logits.
"$PY" "$HERE/export.py" "$RUN" "$OUT"
OMP_NUM_THREADS=1 "$PY" "$HERE/torch_ref.py" "$RUN" "$OUT"

# 6. Verify with MLX (load, round-trip, greedy sample, logits vs torch), then document.
"$MLX_PY" "$HERE/verify.py" "$OUT" --ref "$RUN/ref_logits.npz" --out "$RUN/verify.json"
"$PY" "$HERE/report.py" "$RUN" "$OUT"
