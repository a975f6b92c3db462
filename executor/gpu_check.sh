#!/usr/bin/env bash
# One-GPU check of the executor (target: under 8 minutes on one H200/A100):
#   1. the GPU tests, 2. a profile of this GPU, 3. a few single-GPU plans (batch sizes,
#   checkpointing) validated against the analytical and the profiled cost models and the simulator.
# Usage: bash executor/gpu_check.sh [OUT_DIR]   (run from the repository root)
# Written without a GPU at hand: untested on GPU.
set -uo pipefail
OUT="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$OUT"
MODEL="gpt-1.7b"
SCALE="hidden=1024,layers=4,seq=1024"
CLUSTER="h200-1"
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "environment"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" || exit 2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

step "1/3 GPU tests"
timeout 240 python -m pytest -m gpu tests/executor/test_gpu.py -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest.txt" || status=1

step "2/3 profile ($MODEL scaled $SCALE, bf16)"
timeout 150 python -m executor.profile --model "$MODEL" --scale "$SCALE" --device cuda --dtype bf16 \
    --batch-sizes 1 2 4 8 --tp 1 2 4 8 --out "$OUT/profile.json" 2>&1 | tee "$OUT/profile.txt" || status=1

step "3/3 validate single-GPU plans"
python - "$OUT" <<'PY'
import sys
from specs import uniform_plan
out = sys.argv[1]
for batch, micro, ckpt in [(4, 1, False), (8, 1, False), (8, 1, True), (16, 2, True)]:
    name = f"{out}/plan_b{batch}_m{micro}{'_ckpt' if ckpt else ''}.json"
    uniform_plan(4, global_batch=batch, micro_batches=micro, checkpoint=ckpt, model="gpt-1.7b",
                 cluster="h200-1").save(name)
    print(name)
PY
for plan in "$OUT"/plan_*.json; do
    base="${plan%.json}"
    timeout 60 torchrun --standalone --nproc_per_node 1 -m analysis.validate --plan "$plan" \
        --model "$MODEL" --scale "$SCALE" --cluster "$CLUSTER" --bf16 --steps 5 --json > "$base.analytical.json" \
        || status=1
    if [ -s "$OUT/profile.json" ]; then
        timeout 60 torchrun --standalone --nproc_per_node 1 -m analysis.validate --plan "$plan" \
            --model "$MODEL" --scale "$SCALE" --cluster "$CLUSTER" --bf16 --steps 5 \
            --cost-model profiled --profile "$OUT/profile.json" --json > "$base.profiled.json" || status=1
    fi
done
python - "$OUT" <<'PY'
import json, sys, glob
print(f"{'plan':28s}{'cost model':12s}{'measured ms':>12s}{'pred ms':>10s}{'err':>7s}{'meas MiB':>10s}{'pred MiB':>10s}{'err':>7s}")
for path in sorted(glob.glob(f"{sys.argv[1]}/plan_*.*.json")):
    try:
        v = json.load(open(path))
    except (OSError, ValueError):
        print(f"{path}: no result"); continue
    m = v["measured"]
    for p in v["predictions"]:
        print(f"{path.split('/')[-1][:27]:28s}{p['source'][:11]:12s}{m['step_time_s']*1e3:12.1f}"
              f"{p['time_s']*1e3:10.1f}{p['time_error']:+7.0%}{m['peak_memory_bytes'][0]/2**20:10.0f}"
              f"{p['peak_memory_bytes'][0]/2**20:10.0f}{p['memory_errors'][0]:+7.0%}")
PY
echo; echo "gpu_check finished with status $status; results in $OUT"
exit $status
