#!/usr/bin/env bash
# bench/gpu.sh — hpctrain ViT-B/16 vs timm on one GPU, side by side, in ≤ 8 minutes.
#
# Usage: bash bench/gpu.sh --out DIR [--cpu-smoke] [--batches "256 512"] [--steps N]
#                          [--warmup N] [--budget-s S] [--peak-tflops X]
#
# Measures in one run, each case in its own process, synthetic batches made on the GPU (no DALI,
# no network needed): hpctrain ViT-B/16 bf16 eager and torch.compile'd at two batch sizes, and
# timm's vit_base_patch16_224 at the same batches, bf16, compiled, fused AdamW. Writes
# results.csv, results.json, env.json (GPU, driver, torch/triton/timm versions, git commit),
# table.txt and log.txt into DIR, and prints the table last (images/s, MFU, peak memory,
# ratio to timm). Without CUDA it runs a CPU smoke test instead (tiny model, compile and
# GPU-only checks skipped; timm skipped when not installed).
#
#   --out DIR         where the results go (required)
#   --cpu-smoke       tiny sizes on CPU (automatic when no CUDA device is visible)
#   --batches "A B"   per-GPU batch sizes (default "256 512"; smoke "8 16")
#   --steps N         timed steps per case (default 30; smoke 2)
#   --warmup N        untimed steps first, compilation included (default 5; smoke 1)
#   --budget-s S      wall-clock budget for all cases (default 420); cases that would not fit are skipped
#   --peak-tflops X   dense-bf16 spec peak of the GPU for MFU (default: table of known GPUs; H200 = 989)
#
# Run from the repository root: bash bench/gpu.sh --out "$OUT". The repo's src/ is used through
# PYTHONPATH, whatever hpctrain is installed.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTDIR="" SMOKE=0 BATCHES="" STEPS="" WARMUP="" BUDGET="" PEAK=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out) OUTDIR="${2:?--out needs a directory}"; shift 2 ;;
    --out=*) OUTDIR="${1#*=}"; shift ;;
    --cpu-smoke) SMOKE=1; shift ;;
    --batches) BATCHES="${2:?--batches needs sizes, e.g. \"256 512\"}"; shift 2 ;;
    --steps) STEPS="${2:?--steps needs a number}"; shift 2 ;;
    --warmup) WARMUP="${2:?--warmup needs a number}"; shift 2 ;;
    --budget-s) BUDGET="${2:?--budget-s needs seconds}"; shift 2 ;;
    --peak-tflops) PEAK="${2:?--peak-tflops needs a number}"; shift 2 ;;
    *) echo "bench/gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$OUTDIR" ]; then
  echo "bench/gpu.sh: --out DIR is required (see --help)" >&2
  exit 2
fi

PY="${PYTHON:-python3}"
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
if [ "$SMOKE" = 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "bench/gpu.sh: no CUDA device visible: running the CPU smoke test (--cpu-smoke)" >&2
  SMOKE=1
fi
if [ "$SMOKE" = 1 ]; then
  # tiny model, one thread per process: a check that everything runs, not a measurement
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi

args=(--out "$OUTDIR")
[ "$SMOKE" = 1 ] && args+=(--cpu-smoke)
# shellcheck disable=SC2206
[ -n "$BATCHES" ] && args+=(--batches $BATCHES)
[ -n "$STEPS" ] && args+=(--steps "$STEPS")
[ -n "$WARMUP" ] && args+=(--warmup "$WARMUP")
[ -n "$BUDGET" ] && args+=(--budget-s "$BUDGET")
[ -n "$PEAK" ] && args+=(--peak-tflops "$PEAK")
cd "$REPO"
exec "$PY" "$REPO/bench/gpu_bench.py" "${args[@]}"
