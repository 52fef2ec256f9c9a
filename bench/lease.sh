#!/usr/bin/env bash
# The prepared GPU lease: what one call of the device tool runs on a bare GPU machine (torch, pandas and matplotlib
# there; no package registry, no DALI), within the call's 10 minutes. docs/bench.md ("A GPU lease") gives the call,
# and what the first lease taught: one call is the whole lease (the machine goes back 30 s after it), and the tree
# must be under 64 MiB (results/ out of the index for the call).
#
#   bash bench/lease.sh                       # profile gpu into results/gpu-<card>-<date>/, packed into $OUT
#   bash bench/lease.sh gpu-more              # a later lease: float8, the small CNN's CUDA graphs (a folder of its own)
#   bash bench/lease.sh gpu-rest              # and the one after: activation checkpointing, varlen, attention
#   LEASE_S=540 bash bench/lease.sh gpu       # the seconds the bench may take before it is stopped (default 540)
#
# 1. Wheels carried in .whl/ (torchao) are installed into /tmp/site, without a registry, and put on PYTHONPATH.
# 2. The bench runs the profile under `timeout`: at LEASE_S it gets SIGTERM, stops at the next safe point and writes
#    the tables of the runs that finished (`--resume` with the same --out runs the rest, in a later lease).
#    torch.compile's cache goes to .cache/inductor (TORCHINDUCTOR_CACHE_DIR): a configuration's later runs load what
#    its first compiled.
# 3. Packed for the trip back (at most 8 files come back): $OUT/<folder>.tgz (the result folder: logs, metrics,
#    tables, plots), $OUT/console.log, $OUT/nvidia-smi.txt, and $OUT/compile-cache.tgz when it is under 16 MiB.
# The data must travel with the call: data/shakespeare (the GPT rows) and, for gpu-more's small CNN, the four
# Fashion-MNIST files in data/ (carry both, with .whl). SPEEDUPS_COMMIT names the commit the tree was copied from
# (the tree travels without .git).
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
rm -f "$folder"/diff-*.html "$folder"/chain-*.html "$folder"/index.html  # a commit's pages: bench/diff_pages.py writes them
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
