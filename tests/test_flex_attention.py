"""train_flex_attention.py against train_varlen.py: packed speeches under the document mask get, speech by speech, the
logits each speech gets alone through train_varlen.py's causal SDPA (no attention across speeches, positions from
each speech's start); FlexAttention's BlockMask path (a GPU's) gives the dense mask's logits; the script's other
batchings train train_varlen.py's steps bit for bit."""

import copy
import functools

import pytest
import torch
from conftest import script_definitions
from test_equivalence import assert_identical, first_moments, train, weights

import common

SCRIPT = "src/train_flex_attention.py"
NAMES = ("documents", "document_causal", "DocumentEmbedding", "masked", "use_document_masks", "dense_mask",
         "dense_attention", "compiled_block_mask", "compiled_flex", "block_mask", "flex")  # fmt: skip
# 6 steps of 8 blocks of 64 characters; 2 epochs of 3 steps, so the order of samples across epochs counts
GPT = ["--model", "gpt", "--subset", "24", "--test-subset", "16", "--seq-len", "64", "--batch-size", "8",
       "--epochs", "2", "--sample-chars", "0", "--lr", "1e-3"]  # fmt: skip


def script_code() -> dict:
    """The document mask's functions and classes as train_flex_attention.py defines them (conftest's
    script_definitions: the script's own code, compiled anew, so its torch.compile objects are this call's own)."""
    from torch.nn.attention import flex_attention as fa

    namespace = {"torch": torch, "nn": torch.nn, "functools": functools, "F": torch.nn.functional, "common": common,
                 "create_block_mask": fa.create_block_mask, "create_mask": fa.create_mask,
                 "flex_attention": fa.flex_attention}  # fmt: skip
    return script_definitions(SCRIPT, NAMES, namespace)


@pytest.fixture(scope="module")
def packed():
    """4 training blocks of 64 characters that hold 3 speeches or more each (so every row has speeches after its
    first, whose attention and positions the mask changes), the GPT (seed 0) and the script's definitions."""
    script = script_code()
    inputs = common.text.shakespeare(64)[0].tensors[0][:400]
    speech, _ = script["documents"](inputs)
    rows = inputs[speech[:, -1] >= 2][:4]
    assert len(rows) == 4
    torch.manual_seed(0)
    return rows, common.build_model("gpt", 84, 64).eval(), script


def speeches_against_alone(model, base, rows, script) -> tuple[float, float]:
    """Run `rows` (N, T) through `model` (under the document mask) and `base` (unchanged), and each speech of each
    row alone through `base`: (the largest |difference| between a speech's logits in its row and alone, the same for
    the unmasked base, over every speech but a row's first). Checks on the way that each speech is a run of positions
    with offsets 0, 1, ... and that every speech but a row's first starts at a blank line's last newline."""
    speech, offset = script["documents"](rows)
    worst = seen = 0.0
    with torch.no_grad():
        logits, unmasked = model(rows), base(rows)
        for row in range(len(rows)):
            for index in speech[row].unique():
                where = (speech[row] == index).nonzero().flatten()
                start, end = int(where[0]), int(where[-1]) + 1
                assert torch.equal(where, torch.arange(start, end))  # one speech: positions in a row
                assert torch.equal(offset[row, start:end], torch.arange(end - start))
                alone = base(rows[row : row + 1, start:end])[0]  # (vocab, length): the speech, nothing before
                worst = max(worst, float((logits[row, :, start:end] - alone).abs().max()))
                if start > 0:
                    seen = max(seen, float((unmasked[row, :, start:end] - alone).abs().max()))
    for row, ids in zip(rows, speech, strict=True):
        text = common.text.decode(row, common.text.vocabulary())
        for start in (ids[1:] != ids[:-1]).nonzero().flatten().add(1).tolist():
            assert text[start - 1 : start + 1] == "\n\n" and text[start + 1 : start + 2] != "\n", (text, start)
    return worst, seen


def test_each_packed_speech_s_logits_are_those_of_the_speech_alone(packed):
    """4 rows of packed text, 3 or more speeches each, under the script's document mask (the CPU's path: create_mask
    and SDPA): every speech's logits equal those of the speech alone through the unchanged GPT (causal SDPA, positions
    from 0) within 4e-6 absolute, float32 (logits of about 1; the two attend over other lengths and masks, so the sums
    run in another order: 4.2e-7 measured). The same rows without the mask differ by far more after the first speech:
    the check can fail. Then 3 other rows through the same model (a mask kept from the batch before, or made once
    per shape, fails there) and the first 4 through a deepcopy of it (an EMA's copy must read its own mask). A plain
    causal mask (a speech sees its neighbour), a speech starting one character late or positions not restarting are
    each caught (tests/mutations.py)."""
    rows, base, script = packed
    model = copy.deepcopy(base)
    script["use_document_masks"](model, script["dense_mask"], script["dense_attention"])
    worst, seen = speeches_against_alone(model, base, rows, script)
    print(f"document mask: speech vs alone max |diff| {worst:.2e}; unmasked {seen:.2e}")
    assert worst < 4e-6 and seen > 1e-2, (worst, seen)
    others = common.text.shakespeare(64)[0].tensors[0][1000:1003]
    assert speeches_against_alone(model, base, others, script)[0] < 4e-6
    assert speeches_against_alone(copy.deepcopy(model), base, rows, script)[0] < 4e-6


def test_the_flex_attention_block_mask_path_gives_the_dense_mask_s_logits():
    """The GPU's path, forward only (FlexAttention has no backward on a CPU), on 2 blocks of 512 characters (4 x 4
    tiles of 128, about 8 speeches a block): the compiled create_block_mask and flex_attention in place of create_mask
    and SDPA give the same logits within 4e-6 (float32; another kernel's order of sums: 5.4e-7 measured), and the
    BlockMask skips tiles (its sparsity, the share of tiles left out, above 0). One shape only: torch 2.15's CPU
    flex_attention kernel fails to compile at a second shape, under the dynamic shapes it then tries."""
    script = script_code()  # compiled objects of its own: this test's shape is their first
    rows = common.text.shakespeare(512)[0].tensors[0][:2]
    torch.manual_seed(0)
    dense = common.build_model("gpt", 84, 512).eval()
    tiled = copy.deepcopy(dense)
    script["use_document_masks"](dense, script["dense_mask"], script["dense_attention"])
    script["use_document_masks"](tiled, script["block_mask"], script["flex"])
    with torch.no_grad():
        a, b = dense(rows), tiled(rows)
    mask = tiled.embed.mask
    assert type(mask).__name__ == "BlockMask" and mask.shape == (2, 1, 512, 512)
    difference = float((a - b).abs().max())
    print(f"flex_attention vs dense mask: max |diff| {difference:.2e}, tiles skipped {mask.sparsity():.1f} %")
    assert difference < 4e-6 and mask.sparsity() > 0


@pytest.mark.gpu
def test_on_a_gpu_flex_attention_trains_what_the_dense_mask_trains():
    """On CUDA, forward and backward through the compiled flex_attention (the script's GPU path) against the dense
    mask through SDPA, 4 blocks of 512 characters: the loss within 1e-5 relative and every parameter's gradient
    within 1e-3 relative (float32; two kernels' orders of sums; not measured yet: the first GPU run sets it), then an
    evaluation-sized batch (64 rows) and a 20-character generation through the flex model, which run."""
    script = script_code()
    device = torch.device("cuda")
    rows = common.text.shakespeare(512)[0].tensors
    inputs, targets = rows[0][:4].to(device), rows[1][:4].to(device)
    torch.manual_seed(0)
    dense = common.build_model("gpt", 84, 512).to(device)
    tiled = copy.deepcopy(dense)
    script["use_document_masks"](dense, script["dense_mask"], script["dense_attention"])
    script["use_document_masks"](tiled, script["block_mask"], script["flex"])
    losses = [torch.nn.functional.cross_entropy(m(inputs), targets) for m in (dense, tiled)]
    for loss in losses:
        loss.backward()
    assert abs(losses[0].item() - losses[1].item()) < 1e-5 * losses[0].item()
    for (name, a), b in zip(dense.named_parameters(), tiled.parameters(), strict=True):
        assert (a.grad - b.grad).norm() <= 1e-3 * a.grad.norm() + 1e-12, name
    with torch.no_grad():
        assert tiled(rows[0][:64].to(device)).shape == (64, 84, 512)
    assert len(common.generate(tiled, device, 20, context=512)) > 0


def test_documents_read_back_and_the_base_s_batchings_train_train_varlen_s_steps_bit_for_bit(tmp_path):
    """--batching documents (the default) says which attention ran, samples text through the masked model and keeps
    train_varlen.py's state dict (the same names: a checkpoint loads into train_varlen.py); --batching pack, the base's batching, trains
    train_varlen.py's 6 steps bit for bit (weights and AdamW moments equal), and documents trains other weights
    from the same blocks."""
    run = train(tmp_path / "documents", SCRIPT, *GPT, "--sample-chars", "40")
    assert run["metrics"]["attention"] == "sdpa, dense document mask", run["metrics"].get("attention")
    assert "FlexAttention has no backward on cpu" in run["stdout"] and "generated after a fixed prompt" in run["stdout"]
    pack = train(tmp_path / "pack", SCRIPT, *GPT, "--batching", "pack")
    base = train(tmp_path / "base", "src/train_varlen.py", *GPT, "--batching", "pack")
    assert pack["metrics"]["attention"] == "sdpa, causal"
    assert_identical(weights(pack), weights(base))
    assert all(torch.equal(a, b) for a, b in zip(first_moments(pack), first_moments(base), strict=True))
    assert weights(run).keys() == weights(base).keys()
    assert not torch.equal(weights(run)["block0.attn.q.weight"], weights(base)["block0.attn.q.weight"])
