"""The default reasoning model: a tiny GPT-2 (transformers) with a character-level tokenizer, warm-started on the
arithmetic task by a short supervised pass, saved as an HF folder (config.json, model.safetensors, tokenizer).

    model, tokenizer = load_causal_lm("results/tiny_lm")     # any HF causal-LM folder: the tiny GPT-2, SmolLM2, ...

Why warm-start: RL from random weights on a 0/1 reward has nothing to reinforce; a short supervised pass on the train
split, stopped once the model is right on a set share of train sums (make_tiny_lm.WARM_START_ACCURACY), leaves a
model that has the format and is right on under half the held-out sums (0.38-0.45 on configs/math.yaml), which
GRPO then improves. The folder is made by `python -m rlinf_mini.models.make_tiny_lm` (the entry runs it when
actor.model.model_path is missing). Nothing is downloaded.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from rlinf_mini.models.hf_folder import write_folder_atomically

SPECIALS = ("<pad>", "<eos>", "<unk>")
CHARS = string.digits + "+-*/=.,:()[]{}\\ " + string.ascii_letters


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (digits, operators, letters); <pad> = 0, <eos> = 1, anything else <unk>."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + tuple(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")


def tiny_gpt2(vocab_size: int, hidden_dim: int, num_layers: int, n_positions: int, seed: int) -> GPT2LMHeadModel:
    """A GPT-2 of `num_layers` blocks of width `hidden_dim` (4 heads), weights drawn from `seed` by init_gpt2."""
    config = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=hidden_dim, n_layer=num_layers,
                        n_head=4, bos_token_id=1, eos_token_id=1, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    init_gpt2(model, num_layers, seed)
    return model


def init_gpt2(model: torch.nn.Module, num_layers: int, seed: int) -> None:
    """GPT-2's initialization (transformers' _init_weights: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)),
    biases 0, LayerNorm 1 / 0), drawn by Python's random.Random(seed) in parameter-name order. Why not torch's
    normal_: its CPU kernel is vectorized per instruction set, and the same seed gave other weights with
    ATEN_CPU_CAPABILITY=default than on AVX2 / AVX-512; transformers' init order may change too."""
    import math
    import random

    rng = random.Random(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("bias"):
                p.zero_()
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * num_layers) if name.endswith("c_proj.weight") else 0.02
                p.copy_(torch.tensor([rng.gauss(0.0, std) for _ in range(p.numel())]).view_as(p))


def supervised_warm_start(model: GPT2LMHeadModel, tokenizer, prompts: list[str], answers: list[str], steps: int,
                          batch_size: int, lr: float, seed: int, stop=None, check_every: int = 10) -> list[float]:
    """Up to `steps` AdamW steps of next-token loss on the answer tokens (prompt + answer + <eos>), ending early once
    `stop(model)` (checked every `check_every` steps, in eval mode) is true; returns the losses."""
    gen = torch.Generator().manual_seed(seed)
    eos = tokenizer.eos_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    encoded: dict[int, tuple[list[int], list[int]]] = {}  # example -> (prompt ids, answer ids + eos), each once
    for _ in range(steps):
        idx = torch.randint(len(prompts), (batch_size,), generator=gen).tolist()
        seqs, labels = [], []
        for i in idx:
            if i not in encoded:  # (the tokenizer's call was a fifth of a step's time)
                encoded[i] = (tokenizer(prompts[i], add_special_tokens=False)["input_ids"],
                              tokenizer(answers[i], add_special_tokens=False)["input_ids"] + [eos])
            p, a = encoded[i]
            seqs.append(p + a)
            labels.append([-100] * len(p) + a)  # the loss reads the answer only
        width = max(map(len, seqs))
        input_ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in seqs])  # [B, L]
        label_ids = torch.tensor([s + [-100] * (width - len(s)) for s in labels])  # [B, L]
        mask = (label_ids != -100) | (torch.arange(width) < torch.tensor([len(s) for s in seqs])[:, None])
        loss = model(input_ids=input_ids, attention_mask=mask.long(), labels=label_ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if stop is not None and len(losses) % check_every == 0:
            model.eval()
            if stop(model):
                break
            model.train()
    model.eval()
    return losses


def save_causal_lm(model, tokenizer, path: str | Path) -> None:
    """The HF folder, written atomically."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    write_folder_atomically(path, write)


def load_tokenizer(path: str | Path):
    """The folder's tokenizer, padding on the left, with a pad token (the eos token when it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32):
    """(model in eval mode, tokenizer) from an HF folder."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per worker process on every load clutters the run's console
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    return model, tokenizer
