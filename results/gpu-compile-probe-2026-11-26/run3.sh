#!/usr/bin/env bash
# The third device call (the H200 of run2.sh, still warm): the same pair at batch 32 x 1,024 tokens, where the GPU
# rather than the host should set the pace: train_amp.py / train_compile.py in float16, A B B A.
set -u
mkdir -p "$OUT/r3"
i=0
for s in amp compile compile amp; do
  i=$((i + 1))
  if [ "$SECONDS" -gt 170 ]; then echo "run $i skipped: $SECONDS s gone" | tee -a "$OUT/r3/order.txt"; continue; fi
  echo "run $i train_$s.py start $(date +%T)" | tee -a "$OUT/r3/order.txt"
  timeout 60 python3 "src/train_$s.py" --model gpt2 --device cuda --seq-len 1024 \
    --batch-size 32 --max-steps 40 --warmup-steps 10 --test-subset 50 --log-every 50 \
    --metrics-out "$OUT/r3/$i-train_$s.json" > "$OUT/r3/$i-train_$s.log" 2>&1
  echo "rc=$?"
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print({k: m.get(k) for k in ('tokens_per_s','step_ms_p50','step_ms_p90','step_ms_blocked','compile_s')})" "$OUT/r3/$i-train_$s.json" 2>&1 | tail -1
done
cd "$OUT" && tar czf r3.tgz r3 && rm -rf r3
