"""The rollout's fast paths against oracles: a group's shared prefill (one prefill per distinct prompt), the in-place
KV cache, the early stop of finished rows and the sliced output head give, row by row, what a plain loop without
cache, padding or batch gives (tokens, and log-probs to 1e-5). Their speed is benchmarks/reasoning_generation.py's."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT

from rlinf_mini.config import ReasoningSamplingParams, load_config
from rlinf_mini.models.fast_generation import last_logits, unique_rows
from rlinf_mini.models.llama_decode import is_llama, prompt_trie
from rlinf_mini.models.make_tiny_lm import create_tiny_lm
from rlinf_mini.models.tiny_lm import load_causal_lm, tiny_gpt2
from rlinf_mini.utils.seeding import counter_uniform
from stages.reasoning_rollout import generate


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A briefly warm-started tiny GPT-2: it ends some answers with <eos> early and runs on in others."""
    tmp = tmp_path_factory.mktemp("gen")
    cfg = load_config(["--config", str(ROOT / "configs/math.yaml"), "--actor.model.model-path", str(tmp / "model"),
                       "--data.train-data-paths", str(tmp / "train.jsonl"), "--data.val-data-paths",
                       str(tmp / "val.jsonl"), "--data.arithmetic.num-train", "256", "--data.arithmetic.num-val", "16"])
    create_tiny_lm(cfg, str(tmp / "model"), sft_steps=150)
    return load_causal_lm(tmp / "model")


def plain_loop(model, prompt: list[int], sample_id: int, seed: int, temperature: float, max_new: int, eos: int):
    """One prompt, no cache, no padding: the whole sequence re-run for every token; (tokens, log-probs)."""
    seq, logps = list(prompt), []
    for t in range(max_new):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1] / temperature
        probs = torch.softmax(logits, -1)
        u = counter_uniform(seed, torch.tensor([sample_id]), t, 1)[0, 0]
        token = int(torch.searchsorted(probs.cumsum(-1), u * probs.sum()).clamp(max=len(probs) - 1))
        logps.append(float(torch.log_softmax(logits, -1)[token]))
        seq.append(token)
        if token == eos:
            break
    return seq[len(prompt):], logps


def test_unique_rows_maps_every_row_to_its_first_copy():
    rows, inverse = unique_rows([[1, 2], [3], [1, 2], [3], [4, 5, 6], [1, 2]])
    assert rows == [0, 1, 4] and inverse.tolist() == [0, 1, 0, 1, 2, 0]


def test_groups_sharing_a_prefill_and_stopping_early_equal_a_plain_loop_per_row(lm):
    model, tok = lm
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ["1+2=", "37+45=", "7+80=", "99+99=", "5+5="]]
    group = 4
    rows = [p for p in prompts for _ in range(group)]  # as the rollout worker repeats them: a group's rows consecutive
    ids = torch.arange(len(rows)) + 500
    max_new = 7
    out = generate(model, rows, ids, ReasoningSamplingParams(temperature=1.3), max_new, tok.pad_token_id,
                   tok.eos_token_id, seed=11)
    lengths = out["response_mask"].sum(1)
    # the cases this test is about: rows leave the batch at different steps, and some run to max_new
    assert lengths.min() < lengths.max() == max_new and len(set(lengths.tolist())) >= 3, lengths
    for i, p in enumerate(rows):
        tokens, logps = plain_loop(model, p, int(ids[i]), 11, 1.3, max_new, tok.eos_token_id)
        n = len(tokens)
        assert out["response_ids"][i, :n].tolist() == tokens and int(lengths[i]) == n
        assert (out["response_ids"][i, n:] == tok.pad_token_id).all() and (out["logprobs"][i, n:] == 0).all()
        torch.testing.assert_close(out["logprobs"][i, :n], torch.tensor(logps), atol=1e-5, rtol=0)


def test_the_same_rows_alone_or_in_a_group_give_the_same_responses(lm):
    """A row's response does not depend on whether its prompt's prefill was shared."""
    model, tok = lm
    p = tok("12+34=", add_special_tokens=False)["input_ids"]
    q = tok("8+9=", add_special_tokens=False)["input_ids"]
    sp, ids = ReasoningSamplingParams(), torch.tensor([7, 8, 9, 10])
    shared = generate(model, [p, p, q, p], ids, sp, 6, tok.pad_token_id, tok.eos_token_id, seed=2)
    for i, prompt in enumerate([p, p, q, p]):
        alone = generate(model, [prompt], ids[i:i + 1], sp, 6, tok.pad_token_id, tok.eos_token_id, seed=2)
        n = alone["response_ids"].shape[1]
        assert shared["response_ids"][i, :n].tolist() == alone["response_ids"][0].tolist()
        torch.testing.assert_close(shared["logprobs"][i, :n], alone["logprobs"][0], atol=1e-5, rtol=0)


def test_the_sliced_output_head_gives_the_heads_logits_and_generation_the_plain_loops():
    """A vocabulary of 1500 > the 512-row slices of last_logits (as SmolLM2's 49152 is): the logits are the head's,
    and generate's responses the plain loop's, which runs the whole model with its own head."""
    model = tiny_gpt2(vocab_size=1500, hidden_dim=32, num_layers=2, n_positions=64, seed=3).eval()
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(last_logits(model, hidden), model.lm_head(hidden), atol=1e-6, rtol=0)
        # a slice size that does not divide the vocabulary: the last slice is short
        torch.testing.assert_close(last_logits(model, hidden, chunk=700), model.lm_head(hidden), atol=1e-6, rtol=0)
    rows = [[5, 9, 200], [1400, 3], [5, 9, 200], [77, 78, 79, 80]]
    ids = torch.tensor([3, 4, 5, 6])
    out = generate(model, rows, ids, ReasoningSamplingParams(temperature=0.7), 6, 0, 1, seed=4)
    for i, p in enumerate(rows):
        tokens, logps = plain_loop(model, p, int(ids[i]), 4, 0.7, 6, 1)
        n = len(tokens)
        assert out["response_ids"][i, :n].tolist() == tokens
        torch.testing.assert_close(out["logprobs"][i, :n], torch.tensor(logps), atol=1e-5, rtol=0)
    assert not out["logprobs"].is_inference()  # made under inference_mode, handed out as ordinary tensors


def test_prompt_trie_makes_one_node_per_distinct_prefix():
    tokens, parents, paths = prompt_trie([[5, 6, 7], [5, 6, 8], [5, 6, 7], [9]])
    assert tokens == [5, 6, 7, 8, 9] and parents == [-1, 0, 1, 1, -1]
    assert paths == [[0, 1, 2], [0, 1, 3], [0, 1, 2], [4]]


@pytest.fixture(scope="module")
def tiny_llama():
    """A Llama (SmolLM2's architecture: grouped-query attention, rotary, RMSNorm, SwiGLU) small enough to re-run
    whole for every token; random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    assert is_llama(model)
    return model


def test_the_lean_llama_path_with_a_shared_prefix_prefill_equals_a_plain_loop_per_row(tiny_llama):
    """LlamaDecoder (the prompts' trie prefilled once, its keys gathered per row, its own decode forward) gives each
    row what the HF model re-run whole gives: prompts of different lengths sharing prefixes, repeated prompts, rows
    that stop early and rows that run to max_new."""
    model, max_new = tiny_llama, 8
    prompts = [[11, 12, 13, 14], [11, 12, 13, 99], [11, 12, 13, 14], [40, 41], [11, 12], [200, 3, 4, 5, 6, 7]]
    ids = torch.arange(len(prompts)) + 30
    sp = ReasoningSamplingParams(temperature=1.0)
    # a random model rarely ends: make <eos> a token it draws often, so that rows leave the batch at different steps
    first = generate(model, prompts, ids, sp, max_new, 0, -1, seed=5)
    eos = int(first["response_ids"][:, 1:].flatten().mode().values)
    out = generate(model, prompts, ids, sp, max_new, 0, eos, seed=5)
    lengths = out["response_mask"].sum(1)
    assert lengths.min() < lengths.max() == max_new, lengths
    for i, p in enumerate(prompts):
        tokens, logps = plain_loop(model, p, int(ids[i]), 5, 1.0, max_new, eos)
        n = len(tokens)
        assert out["response_ids"][i, :n].tolist() == tokens and int(lengths[i]) == n
        torch.testing.assert_close(out["logprobs"][i, :n], torch.tensor(logps), atol=1e-5, rtol=0)
    # greedy: the argmax of the whole model re-run, token by token
    greedy_lean = generate(model, prompts, ids, sp, max_new, 0, eos, seed=5, greedy=True)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            seq = list(p)
            for _ in range(int(greedy_lean["response_mask"][i].sum())):
                seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
            n = len(seq) - len(p)
            assert greedy_lean["response_ids"][i, :n].tolist() == seq[len(p):]


@pytest.mark.parametrize("which", ["gpt2", "llama"])
@pytest.mark.parametrize("mode", ["sampled", "top_k_top_p", "greedy"])
def test_the_fast_path_equals_the_plain_loop_rollout_fast_generation_false_reads(which, mode, lm, tiny_llama):
    """rollout.fast_generation picks the decoding path: the plain loop of stages/reasoning_rollout.py (HF's forward
    and cache, every row to the end) and rlinf_mini/models/fast_generation.py give the same tokens, masks and
    log-probs, on groups (shared prefills), prompts of different lengths and rows that stop at different steps."""
    if which == "gpt2":
        model, tok = lm
        prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ["1+2=", "37+45=", "99+99="]]
        prompts, pad = [p for p in prompts for _ in range(3)], tok.pad_token_id
        eos = tok.eos_token_id
    else:
        model, pad = tiny_llama, 0
        prompts = [[11, 12, 13, 14], [11, 12, 13, 14], [40, 41], [11, 12], [200, 3, 4, 5, 6, 7]]
    sp = ReasoningSamplingParams(temperature=1.2, **({"top_k": 5, "top_p": 0.8} if mode == "top_k_top_p" else {}))
    ids = torch.arange(len(prompts)) + 77
    if which == "llama":  # a random model rarely ends: make <eos> the token it draws most often
        probe = generate(model, prompts, ids, sp, 8, pad, -1, seed=3, greedy=mode == "greedy")
        eos = int(probe["response_ids"][:, 1:].flatten().mode().values)
    kw = dict(max_new=8, pad_id=pad, eos_id=eos, seed=3, greedy=mode == "greedy")
    fast = generate(model, prompts, ids, sp, fast=True, **kw)
    plain = generate(model, prompts, ids, sp, fast=False, **kw)
    lengths = fast["response_mask"].sum(1)
    if mode != "greedy":  # the case that matters: rows finish at different steps
        assert len(set(lengths.tolist())) >= 2, lengths
    for key in ("prompt_ids", "prompt_mask", "response_ids", "response_mask"):
        assert torch.equal(fast[key], plain[key]), key
    torch.testing.assert_close(fast["logprobs"], plain["logprobs"], atol=1e-5, rtol=0)
