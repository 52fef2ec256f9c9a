#!/usr/bin/env bash
# The prepared command for a GPU machine rented by the quarter-hour (torch, pandas and matplotlib there; a package
# index and DALI not needed): a profile under a time limit, a safe stop at that limit, one packed folder to bring back,
# and torch.compile's cache kept for the next quarter-hour. docs/bench.md ("On a GPU rented by the quarter-hour") says
# what to copy there and back: a fresh machine keeps nothing of the last one.
#
#   bash bench/lease.sh                       # profile gpu into results/gpu-<card>-<date>/, packed into $OUT
#   bash bench/lease.sh gpu-more              # a later quarter-hour: float8, the small CNN's CUDA graphs (a folder of its own)
#   bash bench/lease.sh gpu-rest              # and the one after: activation checkpointing, varlen, attention
#   bash bench/lease.sh gpu-compile           # and a fourth: the compiled optimizer step
#   LEASE_S=540 bash bench/lease.sh gpu       # the seconds the bench may take before it is stopped (default 540)
#
# 1. Wheels copied along in .whl/ (torchao) are installed into /tmp/site, without a package index, and put on
#    PYTHONPATH.
# 2. The bench runs the profile under `timeout`: at LEASE_S it gets SIGTERM, stops at the next safe point and writes
#    the tables of the runs that finished (`--resume` with the same --out runs the rest, on this machine or on the
#    next one with the folder copied back). torch.compile's cache goes to .cache/inductor (TORCHINDUCTOR_CACHE_DIR):
#    a configuration's later runs load what its first compiled.
# 3. Packed to bring back, in $OUT (default /tmp/lease-out): <folder>.tgz (the result folder: logs, metrics, tables,
#    plots), console.log, nvidia-smi.txt, and compile-cache.tgz when it is under 16 MiB (unpack it into .cache/ on
#    the next machine).
# The data travel with the tree: data/shakespeare (the GPT rows) and, for gpu-more's small CNN, the four Fashion-MNIST
# files in data/. SPEEDUPS_COMMIT names the commit the tree was copied from, for env.json and the tables, when the
# tree travels without .git.
set -uo pipefail
cd "$(dirname "$0")/.."
profile=${1:-gpu}
limit=${LEASE_S:-540}
out=${OUT:-/tmp/lease-out}
mkdir -p "$out"
PYTHON=${PYTHON:-python3}

card=$("$PYTHON" -c "import torch; print(torch.cuda.get_device_name(0).split()[1].lower())" 2>/dev/null) || {
  echo "lease: error: torch sees no CUDA GPU here" >&2
  exit 2
}
if compgen -G ".whl/*.whl" >/dev/null; then
  PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
    || echo "lease: the carried wheels did not install; the rows that need them fail in one line"
fi
folder=${LEASE_FOLDER:-results/gpu-$card-$(date -u +%Y-%m-%d)$([ "$profile" = gpu ] || echo "-$profile")}
export TORCHINDUCTOR_CACHE_DIR=$PWD/.cache/inductor
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
echo "lease: profile $profile on $card into $folder, at most $limit s (commit ${SPEEDUPS_COMMIT:-unknown})"

timeout -s TERM -k 60 "$limit" "$PYTHON" bench/bench.py --profile "$profile" --out "$folder" --resume \
  2>&1 | tee "$out/console.log"
rc=${PIPESTATUS[0]}
echo "lease: the bench ended with $rc (124 or 143: stopped at $limit s; its finished runs are in the tables)" \
  | tee -a "$out/console.log"
cp "$out/nvidia-smi.txt" "$folder/" 2>/dev/null
rm -f "$folder"/diff-*.html "$folder"/chain-*.html "$folder"/index.html  # the bench leaves them out of results/; an older folder may hold them
tar -czf "$out/$(basename "$folder").tgz" "$folder"
if [ -d .cache/inductor ]; then
  tar -czf /tmp/compile-cache.tgz -C .cache inductor
  size=$(stat -c %s /tmp/compile-cache.tgz)
  if [ "$size" -lt $((16 * 1024 * 1024)) ]; then
    mv /tmp/compile-cache.tgz "$out/compile-cache.tgz"
  else
    echo "lease: the compile cache is $((size / 1048576)) MiB, over the 16 MiB a file may bring back: left there" \
      | tee -a "$out/console.log"
  fi
fi
"$PYTHON" bench/bench.py --profile "$profile" --dry-run --costs "$folder" 2>&1 | tail -3 | tee -a "$out/console.log"
exit "$rc"
