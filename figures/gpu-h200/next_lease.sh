#!/bin/bash
# The next H200 lease of issue 40, prepared on the CPU after the third (2026-11-26): the three profiles the third lease's
# serving check lacked, taken as the server runs those calls, and its nine serving traces (lease3/serving: 3 loads x 3
# repeats, float32) checked against them afterwards on any machine - nothing is served again. Expected device time: a
# machine start plus three profiles, ~2-3 minutes (the third lease's two serving profiles took ~100 s):
#   profile-prefill.json          the target's joiner prefill (profile --path server-prefill, eager, 1..1,024 tokens)
#   profile-prefill-drafter.json  the controlled drafter's cost model reading each prompt (the same path)
#   profile-drafter.json          that model's batched draft calls (profile --path server-static, check-serve --draft-profile)
# Run from the repository root on the device (PYTHONPATH with the repository and the carried wheels):
#   bash figures/gpu-h200/next_lease.sh            then, on any machine:
#   python benchmarks/gpu_fidelity.py --device cuda --hardware h200 --dtype float32 --requests 32 --output-len 64 --out DIR
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpuout-local}
D=${D:-.gpuout/gpu-h200-next}
mkdir -p "$D" "$OUT"
cp -r figures/gpu-h200/lease3/serving "$D/"
cp figures/gpu-h200/lease3/results.json "$D/"
rm -f "$D/serving/profile-prefill.json"  # taken through the graphed static path then; now as the server runs a prefill
if [ -d .whl ] && [ ! -d /tmp/site/simpy ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$OUT/env.log"
# the traces are complete (reused); only the missing profiles are taken
timeout --signal=INT 500 python3 benchmarks/gpu_fidelity.py --device cuda --hardware h200 --dtype float32 --requests 32 \
  --output-len 64 --measure-only --skip single --bench-args "--skip batching,sweep" --out "$D" 2>&1 | tee "$OUT/profiles.log"
tar czf "$OUT/next.tgz" -C "$(dirname "$D")" "$(basename "$D")" && ls -la "$OUT"
