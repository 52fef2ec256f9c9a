#!/bin/bash
# lr sweep, steps to 1.70 on the held-out sample, 2 runs at a time with 1 thread each (steps do not depend on speed)
cd /work/main
out=/tmp/sweep
run() { name=$1; shift; OMP_NUM_THREADS=1 python "$@" --model gpt --device cpu --workers 0 --target-loss 1.70 --eval-every 100 --sample-chars 0 --log-every 400 --metrics-out $out/$name.json > $out/$name.log 2>&1; }
run adamw-lr3e-3 src/train.py --lr 3e-3 &
run adamw-lr6e-3 src/train.py --lr 6e-3 &
wait
run adamw-lr1.2e-2 src/train.py --lr 1.2e-2 &
run muon-0.01 src/train_muon.py --muon-lr 0.01 &
wait
run muon-0.02 src/train_muon.py --muon-lr 0.02 &
run muon-0.04 src/train_muon.py --muon-lr 0.04 &
wait
run muon-0.08 src/train_muon.py --muon-lr 0.08 &
run muon-0.02-lr3e-3 src/train_muon.py --muon-lr 0.02 --lr 3e-3 &
wait
echo done > $out/DONE
