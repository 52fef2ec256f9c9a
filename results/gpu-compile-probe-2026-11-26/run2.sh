#!/usr/bin/env bash
# The second device call: train_amp.py and train_compile.py in bfloat16 (no GradScaler, so no per-step sync) in
# A B B A B A order, then one more float16 pair; GPT-2's shape on Shakespeare as the gpu-short profile runs them.
set -u
mkdir -p "$OUT/r2"
i=0
for run in "amp bfloat16" "compile bfloat16" "compile bfloat16" "amp bfloat16" "compile bfloat16" "amp bfloat16" \
           "compile float16" "amp float16"; do
  set -- $run
  i=$((i + 1))
  if [ "$SECONDS" -gt 330 ]; then echo "run $i skipped: $SECONDS s gone" | tee -a "$OUT/r2/order.txt"; continue; fi
  echo "run $i train_$1.py $2 start $(date +%T)" | tee -a "$OUT/r2/order.txt"
  timeout 70 python3 "src/train_$1.py" --model gpt2 --device cuda --seq-len 1024 --amp-dtype "$2" \
    --batch-size 8 --max-steps 40 --warmup-steps 10 --test-subset 50 --log-every 50 \
    --metrics-out "$OUT/r2/$i-train_$1-$2.json" > "$OUT/r2/$i-train_$1-$2.log" 2>&1
  echo "rc=$?"
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print({k: m.get(k) for k in ('tokens_per_s','step_ms_p50','step_ms_p90','step_ms_blocked','compile_s')})" "$OUT/r2/$i-train_$1-$2.json" 2>&1 | tail -1
done
cd "$OUT" && tar czf r2.tgz r2 && rm -rf r2
