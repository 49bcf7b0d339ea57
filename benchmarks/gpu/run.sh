#!/usr/bin/env bash
# One GPU check for an NVIDIA machine (MLX's CUDA backend), under 8 minutes:
#   1. install the mlx-cuda-13 wheel (0.32.4) and this package;
#   2. the fused kernels through mx.fast.cuda_kernel against their plain-MLX twins
#      (agreement + timing: benchmarks/kernels.py);
#   3. greedy parity and decode tokens/s of plain decoding vs fixed blocks vs --block-size auto,
#      on the built-in pair and on a synthetic ~1B-parameter target whose drafter's proposals
#      are scripted (its tau comes from the script; say so): benchmarks/gpu/check.py.
# Results: docs/results/gpu-<device>-kernels.json and gpu-<device>-decode.json (and $OUT when set).
#
#   benchmarks/gpu/run.sh                 # on the GPU machine, from anywhere
#   WHEELS=/path/to/wheels benchmarks/gpu/run.sh   # offline: pip installs from that folder
#   benchmarks/gpu/run.sh --cpu-dry-run   # no install, tiny sizes on this backend: checks the script runs
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DRY=0
[ "${1:-}" = "--cpu-dry-run" ] && DRY=1
say() { echo "[gpu-check] $*" >&2; }

if [ "$DRY" = 0 ]; then
  FIND=()
  [ -n "${WHEELS:-}" ] && FIND=(--no-index --find-links "$WHEELS")
  # The package without its CPU MLX pin, then MLX for CUDA 13 (mlx + mlx-cuda-13).
  if ! timeout 300 $PY -m pip install -q "${FIND[@]}" "mlx[cuda13]==0.32.4" "mlx-lm>=0.32" "typer>=0.27.3,<0.29" rich safetensors \
       && timeout 120 $PY -m pip install -q --no-deps -e .; then
    say "could not install mlx[cuda13]==0.32.4: give a folder of wheels with WHEELS=... (this machine may have no network)"
    exit 2
  fi
  if ! $PY -c "import mlx.core as mx, sys; sys.exit(0 if mx.cuda.is_available() else 1)"; then
    say "MLX sees no CUDA device here: check the driver (nvidia-smi) and that mlx-cuda-13 matches it"
    exit 2
  fi
fi

# A file-name-safe device name, e.g. nvidia-h200.
DEVICE=$($PY -c "
import re, mlx.core as mx
n = mx.device_info().get('device_name', '') if hasattr(mx, 'device_info') else ''
print(re.sub('[^a-z0-9]+', '-', (n or 'unknown').lower()).strip('-'))" 2>/dev/null || echo unknown)
RESULTS=${RESULTS:-docs/results}
# A dry run checks the script, not a GPU: its files stay out of docs/results.
[ "$DRY" = 1 ] && RESULTS=${DRY_RESULTS:-$(mktemp -d)} && DEVICE="${DEVICE}-dry-run"
mkdir -p "$RESULTS"
say "device: $DEVICE"

QUICK=()
[ "$DRY" = 1 ] && QUICK=(--quick)
SIZES=()
[ "$DRY" = 1 ] && SIZES=(--repeats 2 --warmup 1 --vocab 4096 --hidden 256)
# Each step has its own time limit so one slow part cannot eat the whole lease.
timeout 150 $PY benchmarks/kernels.py "${SIZES[@]}" --json "$RESULTS/gpu-$DEVICE-kernels.json" \
  || say "kernels step failed or timed out (exit $?)"
timeout 330 $PY benchmarks/gpu/check.py "${QUICK[@]}" --json "$RESULTS/gpu-$DEVICE-decode.json" \
  || say "decode step failed or timed out (exit $?)"
if [ -n "${OUT:-}" ]; then cp "$RESULTS"/gpu-"$DEVICE"-*.json "$OUT"/ 2>/dev/null || true; fi
say "done: $(ls "$RESULTS"/gpu-"$DEVICE"-*.json 2>/dev/null | tr '\n' ' ')"
