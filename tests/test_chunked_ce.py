"""train_chunked_ce.py against train.py: the loss over chunks of tokens is train.py's loss, its gradients train.py's
gradients, ignored targets (-100) included, and the logits are never held whole: not by autograd between forward and
backward, and in backward one chunk's at a time."""


import pytest
import torch
from conftest import script_definitions
from test_equivalence import assert_parity, first_moments, train

SCRIPT = "src/train_chunked_ce.py"
# 8 steps of 16 blocks of 32 characters (512 tokens a step), chunks of 100 tokens: 5 full chunks and one of 12
GPT = ["--model", "gpt", "--subset", "128", "--test-subset", "64", "--seq-len", "32", "--batch-size", "16",
       "--epochs", "1", "--sample-chars", "0", "--lr", "3e-3"]  # fmt: skip


def script_function(name: str):
    """The function `name` as train_chunked_ce.py defines it (conftest's script_definitions: the script's own code)."""
    return script_definitions(SCRIPT, (name,), {"torch": torch, "nn": torch.nn})[name]


def test_the_chunked_loss_and_its_gradients_are_the_whole_logits_ones_ignored_targets_included():
    """(3, 37) tokens, width 16, a vocabulary of 500, chunks of 10 (11 full chunks and one of 1), a third of the
    targets -100 and spread unevenly over the chunks: the loss, the hidden states' gradient and the head's weight
    gradient equal those of nn.CrossEntropyLoss over the whole logits within 1e-6 relative (float32: only the order of
    the sums differs). A mean per chunk, a divisor counting ignored targets, or a last chunk left out would be off by
    far more. Autograd keeps no tensor with a vocabulary-sized dimension between forward and backward (the chunks'
    logits are recomputed), and backward makes logits of at most 10 rows at a time."""
    chunked_cross_entropy = script_function("chunked_cross_entropy")
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 37, 16, generator=generator)
    targets = torch.randint(0, 500, (3, 37), generator=generator)
    targets[torch.rand(3, 37, generator=generator) < torch.linspace(0, 0.7, 37)] = -100  # more in later chunks
    fc = torch.nn.Linear(16, 500, bias=False)

    h = hidden.clone().requires_grad_()
    expected = torch.nn.CrossEntropyLoss()(fc(h).transpose(1, 2), targets)
    expected.backward()
    want = (expected.detach(), h.grad.clone(), fc.weight.grad.clone())

    fc.weight.grad = None
    h = hidden.clone().requires_grad_()
    saved, made = [], []

    def pack(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = chunked_cross_entropy(h, fc, targets, 10)
    fc.register_forward_hook(lambda module, args, out: made.append(tuple(out.shape)))  # backward's recomputes
    loss.backward()
    got = (loss.detach(), h.grad, fc.weight.grad)
    for a, b in zip(got, want, strict=True):
        assert ((a - b).norm() / b.norm()).item() < 1e-6
    assert (targets == -100).sum() > 30 and len(made) == 12 and max(rows for rows, _ in made) == 10
    assert not [shape for shape in saved if 500 in shape], saved


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("chunked")
    return {
        "base": train(out / "base", "src/train.py", *GPT, "--max-steps", "8", "--vocab-size", "2048"),
        "chunked": train(
            out / "chunked", SCRIPT, *GPT, "--max-steps", "8", "--vocab-size", "2048", "--ce-chunk", "100"
        ),
    }


def test_the_rung_trains_train_py_s_gpt_and_keeps_no_logits_for_backward(runs):
    """The rung and train.py, 8 steps of the GPT with a head of 2,048 outputs (--vocab-size: the tokens stay
    characters): AdamW's first moments within 1e-6 and the weights within 3e-6 relative after 8 steps, each epoch's
    losses within 1e-5 (float32: the chunked sum's order of additions; measured 1.2e-7 and 3.1e-7 on an AVX512-BF16
    EPYC with one thread, printed by assert_parity). Read back first: the rung ran with its chunks, and the activations its probe
    step kept for backward are train.py's less at least the logits (16 x 32 x 2,048 float32, 4 MiB) that train.py's
    loss keeps (its log-softmax) and the rung never does."""
    run, base = runs["chunked"], runs["base"]
    assert run["metrics"]["ce_chunk"] == 100 and run["metrics"]["vocab_size"] == 2048
    logits_mib = 16 * 32 * 2048 * 4 / 2**20
    assert run["metrics"]["activation_mib"] < base["metrics"]["activation_mib"] - 0.99 * logits_mib  # (a few bytes)
    assert run["state"]["model"]["head.fc.weight"].shape == (2048, 128)
    assert_parity(run, base, steps=8, moments=1e-6, weights=3e-6, loss=1e-5, val_loss=1e-5, run_moments=first_moments,
                  label="train_chunked_ce.py")  # fmt: skip
