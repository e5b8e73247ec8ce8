#!/bin/bash
# Device call of issue 40, third H200 lease (2026-11-26): the serving study in float32 (3 loads x 3 repeats against a
# server-path profile taken first), then the single stream, each resumable (--reuse keeps complete traces and written
# profiles). Budget: $1 seconds (default 570). Env: PARTS (serving,single), OUTD, DEVICE, HW, DTYPE, TARGET, COST, REQ, OLEN, MAXB, REP.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
BUDGET=${1:-570}
T0=$(date +%s)
left() { echo $(( BUDGET - $1 - ($(date +%s) - T0) )); }
OUTD=${OUTD:-.gpuout/gpu-h200-fp32b}
OUT=${OUT:-/tmp/gpuout-local}
PARTS=${PARTS:-serving,single}
DEVICE=${DEVICE:-cuda}; HW=${HW:-h200}; DTYPE=${DTYPE:-float32}
TARGET=${TARGET:-random:llama-3.1-8b}; COST=${COST:-random:qwen2.5-0.5b}
REQ=${REQ:-32}; OLEN=${OLEN:-64}; MAXB=${MAXB:-32}; REP=${REP:-3}
mkdir -p "$OUTD" "$OUT"
{
  date -u; nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,power.limit,driver_version,temperature.gpu --format=csv 2>&1
  if [ -d .whl ] && [ ! -d /tmp/site/simpy ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; fi
} 2>&1 | tee -a "$OUT/env.log"
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import sys, torch, transformers, simpy; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())" 2>&1 | tee -a "$OUT/env.log"
COMMON="--device $DEVICE --hardware $HW --dtype $DTYPE --target $TARGET --cost $COST --requests $REQ --output-len $OLEN --max-batch $MAXB --repeats $REP --measure-only --out $OUTD"
for part in ${PARTS//,/ }; do
  t=$(left 25)
  if [ "$t" -lt 60 ]; then echo "$part: skipped, ${t} s left" | tee -a "$OUT/$part.log"; continue; fi
  echo "$part: ${t} s at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/$part.log"
  if [ "$part" = serving ]; then
    timeout --signal=INT --kill-after=10 "$t" python3 benchmarks/gpu_fidelity.py $COMMON --skip single \
      --bench-args "--skip batching,sweep" 2>&1 | tee -a "$OUT/serving.log"
  else
    timeout --signal=INT --kill-after=10 "$t" python3 benchmarks/gpu_fidelity.py $COMMON --skip serving 2>&1 | tee -a "$OUT/single.log"
  fi
  echo "$part rc ${PIPESTATUS[0]} at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/$part.log"
done
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$OUT/env.log"
tar czf "$OUT/study.tgz" -C "$(dirname "$OUTD")" "$(basename "$OUTD")" && ls -la "$OUT"
echo "done at $(( $(date +%s) - T0 )) s"
