#!/bin/bash
cd /work/main
out=/tmp/sweep
while [ ! -f $out/DONE ]; do sleep 5; done
run() { name=$1; shift; OMP_NUM_THREADS=1 python "$@" --model gpt --device cpu --workers 0 --target-loss 1.70 --eval-every 100 --sample-chars 0 --log-every 400 --metrics-out $out/$name.json > $out/$name.log 2>&1; }
run muon-0.02-steps900 src/train_muon.py --muon-lr 0.02 --max-steps 900 &
run adamw-lr6e-3-steps1800 src/train.py --lr 6e-3 --max-steps 1800 &
wait
run muon-0.02-steps1200 src/train_muon.py --muon-lr 0.02 --max-steps 1200 &
run adamw-lr6e-3-steps2200 src/train.py --lr 6e-3 --max-steps 2200 &
wait
echo done > $out/DONE2
