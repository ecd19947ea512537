#!/usr/bin/env bash
# GPU acceptance check: NCCL all-reduce across 2 local "nodes" (bus bandwidth), `status --gpus` telemetry and
# energy from real power readings, `gtrain health --full` (SDC probe included), a container with --gpus all.
# One command from the repository root, <= 8 minutes on a 1- or 8-GPU machine; writes bench/results/gpu.json.
# No GPU: says "no GPU: ..." and exits 0 (so CI runs it). Nothing is installed and nothing is downloaded: it
# needs Python with gtrain's dependencies and a CUDA build of torch (.venv from `make setup` plus that torch,
# or PYTHON=/path/to/python); docker with the NVIDIA container toolkit and a local image for the container step.
# Usage: bench/gpu_check.sh     (GPUCHECK_OUT=FILE, GPUCHECK_IMAGE=IMAGE, GPUCHECK_LOAD_S=40, PYTHON=...)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PYTHON" ]; then
  PYTHON="$(command -v python3 || true)"
fi
if [ -z "$PYTHON" ]; then
  echo "gpu_check: no Python (.venv/bin/python or python3): run \`make setup\` first, or set PYTHON=" >&2
  exit 2
fi
# the whole check under 8 minutes: what is left when the limit hits is still cleaned up by the script's finally
exec timeout --kill-after=30 "${GPUCHECK_TIMEOUT_S:-480}" env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  "$PYTHON" bench/gpu_check.py
