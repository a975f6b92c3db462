#!/usr/bin/env bash
# The prepared GPU check (target: under 10 minutes): GPU tests, bf16 profile of a small LLaMA,
# plans for the local GPUs, runs, one predicted-vs-measured table in OUT_DIR/table.md.
# Usage: bash executor/gpu_check.sh [OUT_DIR] [--cpu]   (run from the repository root)
# Ran on one H200 on 2026-12-04 (docs/executor.md); --cpu rehearses it on 2 processes.
set -euo pipefail
OUT="${1:-gpu_check_out}"
shift || true
timeout 600 python -m benchmarks.gpu_check "$OUT" "$@"
