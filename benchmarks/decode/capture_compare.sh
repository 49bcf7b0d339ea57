#!/usr/bin/env bash
# A terminal capture of the live `dflash2 compare` view, for docs/.
#   bash benchmarks/decode/capture_compare.sh docs/compare-capture-builtin.txt [compare args...]
# Runs compare in a detached tmux pane (160x45), captures the pane while the
# replay plays and once more when the closing table is up. Colours (drafted
# tokens) are not captured by capture-pane -p.
set -euo pipefail
OUT=$1; shift
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-p "def fib(n):" -m 96 --repeats 2)
S=dflash2-capture-$$
tmux new-session -d -s "$S" -x 160 -y 45
trap 'tmux kill-session -t "$S" 2>/dev/null || true' EXIT
BIN=$(command -v dflash2) || { echo "dflash2 is not installed: pip install -e ." >&2; exit 1; }
tmux send-keys -t "$S" "$BIN compare ${ARGS[*]@Q}; echo __DONE__ \$?" Enter
mid="" 
for _ in $(seq 1 1200); do  # up to 10 minutes
  sleep 0.5
  pane=$(tmux capture-pane -p -t "$S")
  # Keep replay frames until one is a second or more in (or the last one seen).
  if grep -q "REPLAY" <<<"$pane" && ! grep -q "t = [1-9]" <<<"$mid"; then mid=$pane; fi
  if grep -q "^__DONE__" <<<"$pane"; then break; fi
done
final=$(tmux capture-pane -p -S -200 -t "$S")
grep -q "^__DONE__ 0" <<<"$final" || { echo "compare failed or timed out:" >&2; tail -5 <<<"$final" >&2; exit 1; }
{
  echo "Command (tmux pane 160x45): dflash2 compare ${ARGS[*]}"
  echo "Captured $(date -u +%Y-%m-%dT%H:%MZ) with tmux capture-pane -p (colours are not captured)."
  echo
  echo "--- during the replay ---"
  echo "$mid" | grep -v "__DONE__" | grep -v "compare -p\|compare '-p'"
  echo
  echo "--- at the end (scrollback) ---"
  echo "$final" | grep -v "__DONE__" | grep -v "compare -p\|compare '-p'"
} > "$OUT"
echo "wrote $OUT"
