"""Interleaved pairs, nanoGPT's train.py against ours at nanoGPT's laptop shape, same split, same machine."""
import json, re, statistics, subprocess, sys, time
from pathlib import Path
OUT = Path(sys.argv[1]); OUT.mkdir(parents=True, exist_ok=True)
PAIRS, ITERS = 3, 300
NANO = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--dataset=ours", "--device=cpu", "--compile=False",
        "--dtype=float32", "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4",
        "--n_head=4", "--n_embd=128", "--dropout=0.0", "--always_save_checkpoint=False", "--out_dir=/tmp/nanogpt/out"]
OURS = [sys.executable, "src/train.py", "--model", "gpt", "--device", "cpu", "--batch-size", "12", "--seq-len", "64",
        "--lr", "1e-3", "--workers", "0", "--log-every", "100"]
def nano(iters, log, evals):
    cmd = NANO + [f"--max_iters={iters}", f"--lr_decay_iters={iters}", f"--eval_interval={evals}"]
    p = subprocess.run(cmd, cwd="/tmp/nanogpt", capture_output=True, text=True)
    log.write_text(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    assert p.returncode == 0, p.stderr[-2000:]
    its = re.findall(r"^iter (\d+): loss \S+, time ([\d.]+)ms", p.stdout, re.M)
    dts = [float(t) for i, t in its if int(i) >= 50]
    vals = [(int(s), float(v)) for s, v in re.findall(r"^step (\d+): train loss \S+, val loss ([\d.]+)", p.stdout, re.M)]
    return {"step_ms_p50": statistics.median(dts), "tokens_per_s": 768e3 / statistics.median(dts), "val": vals}
def ours(steps, log, metrics, extra=()):
    cmd = OURS + ["--max-steps", str(steps), "--warmup-steps", "50", "--metrics-out", str(metrics), *extra]
    p = subprocess.run(cmd, cwd="/work/main", capture_output=True, text=True)
    log.write_text(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    assert p.returncode == 0, p.stderr[-2000:]
    m = json.loads(metrics.read_text())
    return {"step_ms_p50": m["step_ms_p50"], "tokens_per_s": 768e3 / m["step_ms_p50"],
            "val": [(e["step"], e["val_loss"]) for e in m["epochs"]]}
rows = []
for i in range(PAIRS):
    order = ("nanogpt", "ours") if i % 2 == 0 else ("ours", "nanogpt")
    got = {}
    for who in order:
        if who == "nanogpt":
            got[who] = nano(ITERS, OUT / f"nanogpt-pair{i}.log", ITERS)
        else:
            got[who] = ours(ITERS, OUT / f"ours-pair{i}.log", OUT / f"ours-pair{i}.json", ["--test-subset", "100"])
    rows.append({"pair": i, "order": " then ".join(order), **{f"{w}_tokens_per_s": got[w]["tokens_per_s"] for w in got},
                 "ratio_ours_over_nanogpt": got["ours"]["tokens_per_s"] / got["nanogpt"]["tokens_per_s"]})
    print(rows[-1], flush=True)
loss = {"nanogpt": nano(2000, OUT / "nanogpt-2000.log", 500), "ours": ours(2000, OUT / "ours-2000.log", OUT / "ours-2000.json")}
(OUT / "pairs.json").write_text(json.dumps({"pairs": rows, "loss_2000": loss}, indent=2))
print(json.dumps(loss, indent=1))
