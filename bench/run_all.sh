#!/usr/bin/env bash
# Run every bench/bench_*.py that exists, in name order, then print one summary line per script.
# Usage: bench/run_all.sh            (uses .venv/bin/python; set PYTHON=... to use another interpreter)
# Each script prints its own table and writes bench/results/<name>.json. Exit status: 0 if all passed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
shopt -s nullglob
scripts=(bench/bench_*.py)
if [ ${#scripts[@]} -eq 0 ]; then
  echo "no bench/bench_*.py scripts found" >&2
  exit 1
fi
summary=()
failed=0
for s in "${scripts[@]}"; do
  echo "==== $s"
  start=$(date +%s.%N)
  "$PYTHON" "$s"
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  [ "$rc" -eq 0 ] && verdict=ok || { verdict="FAILED (exit $rc)"; failed=1; }
  summary+=("$(printf '%-28s %-18s %8ss' "$s" "$verdict" "$secs")")
  echo
done
echo "==== summary"
printf '%s\n' "${summary[@]}"
echo "results: bench/results/*.json"
exit "$failed"
