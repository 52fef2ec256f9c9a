#!/usr/bin/env bash
# The device call that made this folder (from the repository root, OUT set): the probe, then train_amp.py and
# train_compile.py alternately (A B B A), GPT-2's shape on Shakespeare as the gpu-short profile runs them, with the
# GPU's clocks, power and utilisation sampled every 500 ms.
set -u
mkdir -p "$OUT/r/scripts"
nvidia-smi > "$OUT/r/nvidia-smi.txt"
python3 -c 'import torch, sys, platform; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0)); print(platform.processor(), __import__("os").cpu_count())' > "$OUT/r/versions.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 500 > "$OUT/r/smi.csv" &
SMI=$!
echo "probe start $(date +%T)"
timeout 200 python3 results/gpu-compile-probe-2026-11-26/probe.py "$OUT/r/probe" > "$OUT/r/probe-console.log" 2>&1
echo "probe rc=$? $(date +%T)"
grep '^{' "$OUT/r/probe-console.log"
i=0
for s in amp compile compile amp amp compile; do
  i=$((i + 1))
  if [ "$SECONDS" -gt 360 ]; then echo "run $i skipped: $SECONDS s gone" | tee -a "$OUT/r/scripts/order.txt"; continue; fi
  echo "run $i train_$s.py start $(date +%T)" | tee -a "$OUT/r/scripts/order.txt"
  TORCH_LOGS=recompiles,graph_breaks timeout 70 python3 "src/train_$s.py" --model gpt2 --device cuda --seq-len 1024 \
    --batch-size 8 --max-steps 40 --warmup-steps 10 --test-subset 50 --log-every 50 \
    --metrics-out "$OUT/r/scripts/$i-train_$s.json" > "$OUT/r/scripts/$i-train_$s.log" 2>&1
  echo "rc=$?"
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print({k: m.get(k) for k in ('tokens_per_s','step_ms_p50','step_ms_p90','step_ms_blocked','compile_s','graphs_compiled','recompiled_steps','data_wait_fraction')})" "$OUT/r/scripts/$i-train_$s.json" 2>&1 | tail -1
done
kill $SMI
cd "$OUT" && tar czf traces.tgz r/probe/*-trace.json && rm -f r/probe/*-trace.json && tar czf r.tgz r && rm -rf r && ls -la "$OUT"
