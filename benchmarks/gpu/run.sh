#!/usr/bin/env bash
# One GPU check for a lent NVIDIA machine (MLX's CUDA backend), ending by itself in under
# 8 minutes: benchmarks/gpu/check.py says what it measures, verdicts.py what must show.
# Results: one JSON, written whole after every result (a step that times out or crashes
# leaves the earlier ones), and one log per step beside it.
#
# On the lent H200 (the `run` device tool; it reaches no registry, nothing is pip-installed
# from one there). First, here, in the project's venv, from the checkout's root:
#     ../shared/tools/gpu-prepare.sh        # MLX / mlx-cuda-13 / mlx-lm / server wheels -> .gpu/p1..p3
# then three calls back to back (a machine idle ~30 s goes back, and a fresh one starts bare):
#     run(command="bash .gpu/p1/gpu-stage.sh", carry=[".gpu/p1"], timeout_s=120)
#     run(command="bash .gpu/p2/gpu-stage.sh", carry=[".gpu/p2"], timeout_s=120)
#     run(command="bash .gpu/p3/gpu-stage.sh bash benchmarks/gpu/run.sh", carry=[".gpu/p3"], timeout_s=560)
# and give_back() at once. The third call installs MLX for CUDA and this checkout (not
# editable) into /tmp/site and runs this script: about 450 s of steps after the install,
# each with its own limit; $OUT/gpu-check.json and $OUT/gpu-check-logs/ come back with it.
# If the machine is still warm, a rerun is: run(command="bash /tmp/gpu-wheels/gpu-stage.sh
# bash benchmarks/gpu/run.sh", timeout_s=560) (no carry needed).
#
#     bash benchmarks/gpu/run.sh --cpu-dry-run    # here: no install, tiny sizes, a temp folder
#                                                 # (DRY_RESULTS=folder to choose it)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
# Here the project's venv is the Python (on the GPU machine there is none: /tmp/site is on PYTHONPATH).
[ -z "${PYTHON:-}" ] && [ -z "${VIRTUAL_ENV:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
say() { echo "[gpu-check] $*" >&2; }

if [ "${1:-}" = "--cpu-dry-run" ]; then
  RESULTS=${DRY_RESULTS:-$(mktemp -d)}
  mkdir -p "$RESULTS"
  say "dry run (tiny sizes, this machine's backend): $RESULTS/gpu-check.json"
  $PY benchmarks/gpu/check.py --quick --json "$RESULTS/gpu-check.json"
  say "done: $RESULTS/gpu-check.json"
  exit 0
fi

if ! $PY -c "import mlx.core as mx, sys; sys.exit(0 if mx.cuda.is_available() else 1)" 2>/dev/null; then
  say "MLX sees no CUDA device here: on the lent GPU run this through gpu-stage.sh (see this file's"
  say "header); on any other machine use --cpu-dry-run"
  exit 2
fi
RESULTS=${OUT:-benchmarks/results}
mkdir -p "$RESULTS"
$PY benchmarks/gpu/check.py --json "$RESULTS/gpu-check.json"
say "done: $RESULTS/gpu-check.json"
