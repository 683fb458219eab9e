"""The reasoning flow: generation against plain references, log-prob agreement between rollout and actor, GRPO
token advantages and loss aggregation against per-sequence loops, the data files and loader, config errors, and
whole runs: 1 vs 2 rollout ranks and resume vs straight, bitwise."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from conftest import ROOT, write_config

from rlinf_mini.config import ReasoningSamplingParams, load_config
from rlinf_mini.data.arithmetic import write_arithmetic_jsonl
from rlinf_mini.data.prompt_dataset import PromptDataset, PromptLoader
from rlinf_mini.models.generation import sample_tokens
from rlinf_mini.models.make_tiny_lm import create_tiny_lm, warm_start_examples
from rlinf_mini.models.tiny_lm import build_char_tokenizer, load_causal_lm
from rlinf_mini.train import ReasoningRunPlan, build_and_run, main
from stages.losses import KL_PENALTY_TYPES
from stages.reasoning_reward import math_reward
from stages.reasoning_rollout import generate
from stages.reasoning_train import (
    ReasoningActorWorker,
    agg_scale,
    compute_grpo_token_advantages,
    compute_response_logprobs,
    kl_penalty,
    stack_chunks,
    token_weights,
)

CONFIG = str(ROOT / "configs/math.yaml")


def small_argv(tmp_path, model: str, *extra: str, config: str = CONFIG) -> list[str]:
    return ["--config", config, "--actor.model.model-path", model,
            "--data.train-data-paths", str(tmp_path / "train.jsonl"),
            "--data.val-data-paths", str(tmp_path / "val.jsonl"),
            "--data.arithmetic.num-train", "512", "--data.arithmetic.num-val", "32",
            "--runner.logger.log-path", str(tmp_path / "results"), *extra]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A briefly warm-started tiny GPT-2 (it ends its answers with <eos>, and is right on a few sums, so rewards
    differ within some groups) and its config."""
    tmp = tmp_path_factory.mktemp("tiny")
    cfg = load_config(small_argv(tmp, str(tmp / "model")))
    create_tiny_lm(cfg, str(tmp / "model"), sft_steps=300)
    model, tok = load_causal_lm(tmp / "model")
    return tmp, cfg, model, tok


PROMPTS = ["1+2=", "37+45=", "7+80=", "99+99=", "5+5="]  # different lengths: left padding differs per row


def ids_of(tok, prompts):
    return [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 5, 0.9)])
def test_rollout_logprobs_equal_the_actors_recomputation(tiny, temperature, top_k, top_p):
    _, _, model, tok = tiny
    sp = ReasoningSamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    prompts = ids_of(tok, PROMPTS) * 4
    out = generate(model, prompts, torch.arange(len(prompts)), sp, 6, tok.pad_token_id, tok.eos_token_id, seed=3)
    assert out["response_mask"].sum(1).min() < out["response_mask"].shape[1]  # some responses stopped at <eos>
    perm = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(0))  # another batch order
    model.train()  # the actor's mode (no dropout in this model)
    with torch.no_grad():
        recomputed = compute_response_logprobs(model, out["prompt_ids"][perm], out["prompt_mask"][perm],
                                               out["response_ids"][perm], out["response_mask"][perm], temperature)
    model.eval()
    torch.testing.assert_close(recomputed, out["logprobs"][perm], atol=1e-5, rtol=0)


def test_kv_cache_generation_equals_a_plain_loop_per_prompt(tiny):
    """Oracle: one prompt at a time, no padding, no cache, the whole sequence re-run for every token."""
    _, _, model, tok = tiny
    sp = ReasoningSamplingParams(temperature=0.8)
    prompts = ids_of(tok, PROMPTS)
    out = generate(model, prompts, torch.arange(5) + 100, sp, 5, tok.pad_token_id, tok.eos_token_id, seed=7)
    from rlinf_mini.utils.seeding import counter_uniform

    for i, p in enumerate(prompts):
        seq, logps = list(p), []
        for t in range(5):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([seq])).logits[0, -1] / 0.8
            probs = torch.softmax(logits, -1)
            u = counter_uniform(7, torch.tensor([100 + i]), t, 1)[0, 0]
            token = int(torch.searchsorted(probs.cumsum(-1), u * probs.sum()).clamp(max=len(probs) - 1))
            logps.append(float(torch.log_softmax(logits, -1)[token]))
            seq.append(token)
            if token == tok.eos_token_id:
                break
        n = len(seq) - len(p)
        assert out["response_ids"][i, :n].tolist() == seq[len(p):]
        assert out["response_mask"][i].sum() == n
        torch.testing.assert_close(out["logprobs"][i, :n], torch.tensor(logps), atol=1e-5, rtol=0)


def test_greedy_equals_hf_generate(tiny):
    _, _, model, tok = tiny
    prompts = ids_of(tok, PROMPTS)
    out = generate(model, prompts, torch.arange(5), ReasoningSamplingParams(), 5, tok.pad_token_id, tok.eos_token_id,
                   seed=0, greedy=True)
    for i, p in enumerate(prompts):
        ref = model.generate(torch.tensor([p]), max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)[0, len(p):].tolist()
        n = int(out["response_mask"][i].sum())
        assert out["response_ids"][i, :n].tolist() == ref[:n]


def test_responses_do_not_depend_on_the_batch_they_are_generated_in(tiny):
    _, _, model, tok = tiny
    prompts = ids_of(tok, PROMPTS) * 2
    sp = ReasoningSamplingParams()
    ids = torch.arange(10) + 1000
    whole = generate(model, prompts, ids, sp, 5, tok.pad_token_id, tok.eos_token_id, seed=1)
    part = generate(model, prompts[3:7], ids[3:7], sp, 5, tok.pad_token_id, tok.eos_token_id, seed=1)
    n = part["response_ids"].shape[1]
    assert torch.equal(whole["response_ids"][3:7, :n] * whole["response_mask"][3:7, :n], part["response_ids"] *
                       part["response_mask"])


def test_top_k_top_p_sampling_against_a_per_row_reference():
    gen = torch.Generator().manual_seed(0)
    logits, u = torch.randn(64, 11, generator=gen) * 2, torch.rand(64, generator=gen)
    for top_k, top_p in [(-1, 1.0), (3, 1.0), (-1, 0.6), (4, 0.8), (1, 1.0)]:
        got = sample_tokens(logits, u, top_k, top_p)
        for row in range(64):
            probs = torch.softmax(logits[row], -1)
            order = sorted(range(11), key=lambda j: (-float(probs[j]), j))
            kept, mass = [], 0.0
            for j in order:
                if (top_k > 0 and len(kept) == top_k) or (kept and mass >= top_p):
                    break
                kept.append(j)
                mass += float(probs[j])
            assert int(got[row]) in kept
        if top_k == 1:
            assert torch.equal(got, logits.argmax(-1))


def test_grpo_token_advantages_and_loss_aggregation_against_loops():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (12,), generator=gen).float() * 2 - 1  # [N] = 3 groups of 4
    mask = (torch.arange(5) < torch.randint(1, 6, (12, 1), generator=gen)).float()  # [N, R]
    adv = compute_grpo_token_advantages(rewards, mask, 4)
    for n in range(12):
        g = rewards[n // 4 * 4: n // 4 * 4 + 4].tolist()
        mean = sum(g) / 4
        std = (sum((x - mean) ** 2 for x in g) / 3) ** 0.5
        for r in range(5):
            assert abs(float(adv[n, r]) - (g[n % 4] - mean) / (std + 1e-6) * float(mask[n, r])) < 1e-5
    loss = torch.randn(12, 5, generator=gen)
    lengths = mask.sum(1)
    want = {"token-mean": (loss * mask).sum() / mask.sum(),
            "seq-mean-token-sum": sum((loss[n] * mask[n]).sum() for n in range(12)) / 12,
            "seq-mean-token-mean": sum((loss[n] * mask[n]).sum() / lengths[n] for n in range(12)) / 12}
    for name, value in want.items():
        w = token_weights(mask, name)
        got = (loss * w).sum() / w.sum() * agg_scale(mask, name)
        assert abs(float(got) - float(value)) < 1e-5, name
    lp, ref = torch.randn(20, generator=gen) * 0.5, torch.randn(20, generator=gen) * 0.5  # inside RLinf's clamps
    assert torch.allclose(kl_penalty(lp, ref, "low_var_kl"), torch.exp(ref - lp) - (ref - lp) - 1)
    assert float(kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl")) == 10.0  # clamped
    assert torch.equal(kl_penalty(lp, lp, "low_var_kl"), torch.zeros(20))


# fixed log-probs (policy, reference) and RLinf's kl_penalty (rlinf/algorithms/utils.py) worked out by hand:
# d = logp - ref; kl/k1: d; abs: |d|; mse/k2: d^2 / 2; low_var_kl/k3: e^-d + d - 1 with -d clamped to [-20, 20] and
# the result to [-10, 10]. The last two pairs hit the clamps: -d = 30 -> e^20 - 21 -> 10; -d = -30 -> e^-20 + 19 -> 10
KL_LOGP = [-1.0, -0.5, -2.0, -0.1, -30.0, 0.0]
KL_REF = [-1.5, -0.5, -0.2, -2.3, 0.0, -30.0]
KL_EXPECTED = {
    "kl": [0.5, 0.0, -1.8, 2.2, -30.0, 30.0],
    "abs": [0.5, 0.0, 1.8, 2.2, 30.0, 30.0],
    "mse": [0.125, 0.0, 1.62, 2.42, 450.0, 450.0],
    "low_var_kl": [math.exp(-0.5) + 0.5 - 1, 0.0, math.exp(1.8) - 1.8 - 1, math.exp(-2.2) + 2.2 - 1, 10.0, 10.0],
}
KL_EXPECTED |= {"k1": KL_EXPECTED["kl"], "k2": KL_EXPECTED["mse"], "k3": KL_EXPECTED["low_var_kl"]}


@pytest.mark.parametrize("kl_type", KL_PENALTY_TYPES)
def test_kl_penalty_equals_rlinfs_formula_for_each_type(kl_type):
    got = kl_penalty(torch.tensor(KL_LOGP), torch.tensor(KL_REF), kl_type)
    torch.testing.assert_close(got, torch.tensor(KL_EXPECTED[kl_type]), atol=1e-5, rtol=1e-5)
    same = torch.tensor(KL_LOGP[:4])
    assert torch.equal(kl_penalty(same, same, kl_type), torch.zeros(4))  # no drift, no penalty


class _RewardChunks:
    """Stands in for the reward channel of one step: run_training's get(key=("reward", c)) is chunk c."""

    def __init__(self, chunks: list[dict]):
        self.chunks = chunks

    def get(self, key, expected_from=""):
        return self.chunks[key[1]]


def test_the_reference_model_is_frozen_and_train_kl_is_its_distance(tiny):
    """Three training steps with kl_beta > 0 on one in-process actor rank: the reference never gets a gradient nor
    changes, the policy does, and train/actor/kl_loss (RLinf's name) is low_var_kl(policy, reference) averaged over
    the response tokens, recomputed here from the two models."""
    tmp, _, _, tok = tiny
    cfg = load_config(small_argv(tmp, str(tmp / "model"), "--algorithm.kl-beta", "0.1", "--actor.optim.lr", "0.003",
                                 "--data.rollout-batch-size", "8", "--actor.global-batch-size", "64",
                                 "--actor.micro-batch-size", "64"))
    actor = ReasoningActorWorker.__new__(ReasoningActorWorker)
    actor._rank, actor._world_size, actor._group_name, actor.device = 0, 1, "ActorGroup", torch.device("cpu")
    actor.__init__(cfg)
    actor.init_worker()
    ref_start = {k: v.clone() for k, v in actor.ref_model.state_dict().items()}
    policy_start = {k: v.clone() for k, v in actor.model.state_dict().items()}
    G, gen = cfg.algorithm.group_size, torch.Generator().manual_seed(0)
    try:
        for step in range(3):
            chunks = []
            for c in range(2):  # 2 chunks of 4 prompts x G responses
                prompts = [p for p in ids_of(tok, PROMPTS[c:c + 4]) for _ in range(G)]
                out = generate(actor.model, prompts, torch.arange(len(prompts)) + 1000 * step + 100 * c,
                               cfg.algorithm.sampling_params, 4, tok.pad_token_id, tok.eos_token_id, seed=5)
                rewards = torch.randint(0, 2, (len(prompts),), generator=gen).float() * 2 - 1
                chunks.append(out | {"rewards": rewards, "version": step})
            step_start = copy.deepcopy(actor.model)  # one optimizer step per training step: its loss saw these
            metrics = actor.run_training(_RewardChunks(chunks), 2, step, 1)
            assert all(not p.requires_grad and p.grad is None for p in actor.ref_model.parameters())
            assert all(torch.equal(v, ref_start[k]) for k, v in actor.ref_model.state_dict().items())
        assert not all(torch.equal(v, policy_start[k]) for k, v in actor.model.state_dict().items())
        b = stack_chunks(chunks, tok.pad_token_id)
        args = (b["prompt_ids"], b["prompt_mask"], b["response_ids"], b["response_mask"], 1.0)
        with torch.no_grad():
            d = compute_response_logprobs(step_start, *args) - compute_response_logprobs(actor.ref_model, *args)
        mask = b["response_mask"].float()
        want = ((torch.exp(-d) + d - 1).clamp(max=10) * mask).sum() / mask.sum()  # low_var_kl, token-mean
        assert metrics["train/actor/kl_loss"] > 0 and "train/kl" not in metrics  # logged once, under RLinf's name
        assert abs(metrics["train/actor/kl_loss"] - float(want)) < 1e-5
    finally:
        actor.close()


@pytest.mark.parametrize("zero_pad", [True, False])
def test_arithmetic_files_and_a_resumable_loader(tmp_path, zero_pad):
    cfg = load_config(small_argv(tmp_path, str(tmp_path / "m"), *(["--data.arithmetic.zero-pad"] if zero_pad else
                                                                   ["--data.arithmetic.no-zero-pad"])))
    write_arithmetic_jsonl(cfg.data, tmp_path / "train.jsonl", tmp_path / "val.jsonl")
    train = [json.loads(ln) for ln in (tmp_path / "train.jsonl").read_text().splitlines()]
    val = [json.loads(ln) for ln in (tmp_path / "val.jsonl").read_text().splitlines()]
    assert len(train) == 512 and len(val) == 32
    held_out = {r["prompt"] for r in val}
    swapped = {"+".join(reversed(p[:-1].split("+"))) + "=" for p in held_out}  # 37+45= -> 45+37=
    warm_prompts, warm_answers = warm_start_examples(cfg, build_char_tokenizer())  # what the warm start reads
    assert len(warm_prompts) == 512 and not set(warm_prompts) & (held_out | swapped)
    assert warm_answers[0] == train[0]["solutions"][0]
    for row in train + val:
        a, b = map(int, row["prompt"][:-1].split("+"))
        want = f"{a + b:03d}" if zero_pad else str(a + b)
        assert row["solutions"] == [want] and math_reward(str(a + b), row["solutions"]) == 1.0  # '052' is 52
        assert (row["prompt"] == f"{a:02d}+{b:02d}=") if zero_pad else (row["prompt"] == f"{a}+{b}=")
    assert all(len(r["prompt"]) == 6 for r in train) == zero_pad  # as written, some operand has one digit
    loader = PromptLoader(100, 16, shuffle=True, seed=3)
    straight = [loader.next_batch() for _ in range(14)]  # crosses an epoch (6 batches of 16 per 100 prompts)
    again = PromptLoader(100, 16, shuffle=True, seed=3)
    head = [again.next_batch() for _ in range(5)]
    resumed = PromptLoader(100, 16, shuffle=True, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(again.state_dict())))
    assert head + [resumed.next_batch() for _ in range(9)] == straight
    assert straight[6] != straight[0] and sorted(sum(straight[:6], [])) == sorted(set(sum(straight[:6], [])))


def test_a_prompt_file_with_other_keys_is_an_error_naming_the_line(tmp_path, tiny):
    _, cfg, _, tok = tiny
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1=", "solutions": ["2"]}\n{"question": "2+2="}\n')
    with pytest.raises(ValueError, match="bad.jsonl line 2"):
        PromptDataset.from_files([str(tmp_path / "bad.jsonl")], cfg.data, tok)


@pytest.mark.parametrize("flags,key", [
    (["--algorithm.rollout-batch-size-per-gpu", "5"], "algorithm.rollout_batch_size_per_gpu"),
    (["--actor.model.model-type", "mlp_policy"], "actor.model.model_type"),
    (["--data.dataset-name", ""], "data.train_data_paths[0]"),
    (["--runner.seq-length", "8"], "algorithm.sampling_params.max_new_tokens"),
    (["--algorithm.sampling-params.top-p", "0"], "algorithm.sampling_params.top_p"),
    (["--actor.global-batch-size", "96", "--actor.micro-batch-size", "32"], "actor.global_batch_size"),
    (["--algorithm.group-size", "1"], "algorithm.group_size"),
])
def test_bad_reasoning_config_is_one_line_naming_the_key(tmp_path, capsys, tiny, flags, key):
    assert main(small_argv(tmp_path, str(tiny[0] / "model"), *flags)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err, err
    assert not (tmp_path / "results").exists()  # no run folder: no worker started


def run(tmp, model, name, steps, placement, *extra):
    config = str(write_config(tmp, base="configs/math.yaml", cluster={"component_placement": placement}))
    argv = small_argv(tmp, model, "--runner.max-epochs", str(steps), "--runner.val-check-interval", "-1",
                      "--runner.logger.experiment-name", name, "--data.rollout-batch-size", "8",
                      "--actor.global-batch-size", "32", "--actor.micro-batch-size", "32",
                      "--algorithm.rollout-batch-size-per-gpu", "2", "--algorithm.kl-beta", "0.01", *extra,
                      config=config)  # kl_beta > 0: the reference-model path runs too
    cfg = load_config(argv)
    plan = ReasoningRunPlan(cfg, "test")
    return plan.run_dir, build_and_run(cfg, plan)


def weights(run_dir, step):
    return torch.load(run_dir / f"checkpoints/global_step_{step}/actor.pt", weights_only=True)["model"]


@pytest.mark.slow  # 9 worker processes, each importing transformers: ~40 s of CPU, over the default suite's budget
def test_one_or_two_rollout_ranks_and_resume_give_bitwise_the_same_run(tiny):
    tmp, _, _, _ = tiny
    model = str(tmp / "model")
    one = {"actor": "0", "rollout,reward": "1"}
    two = {"actor": "0", "rollout": "0-1", "reward": "1"}
    dir_a, hist_a = run(tmp, model, "one_rank", 2, one, "--runner.save-interval", "1")
    dir_b, hist_b = run(tmp, model, "two_ranks", 2, two, "--runner.save-interval", "2")
    dir_c, hist_c = run(tmp, model, "resumed", 2, one, "--runner.save-interval", "2",
                        "--runner.resume-dir", str(dir_a / "checkpoints/global_step_1"))
    keys = ["rollout/rewards", "rollout/response_length", "rollout/accuracy", "train/actor/policy_loss"]
    assert [[h[k] for k in keys] for h in hist_a] == [[h[k] for k in keys] for h in hist_b]
    assert [h[k] for h in hist_a[1:] for k in keys] == [h[k] for h in hist_c for k in keys]
    assert any(h["train/actor/grad_norm"] > 0 for h in hist_a)  # the weights did move
    assert hist_a[-1]["train/actor/kl_loss"] > 0  # the policy drifted from the frozen reference
    a, b, c = weights(dir_a, 2), weights(dir_b, 2), weights(dir_c, 2)
    assert not all(torch.equal(a[k], weights(dir_a, 1)[k]) for k in a)
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
    assert json.loads((dir_c / "checkpoints/global_step_2/runner.json").read_text()) == \
        json.loads((dir_a / "checkpoints/global_step_2/runner.json").read_text())


def test_chunks_must_split_evenly_over_the_actor_ranks():
    from rlinf_mini.config import ConfigError, check_reasoning_batch_arithmetic

    cfg = load_config(["--config", CONFIG, "--algorithm.rollout-batch-size-per-gpu", "16",
                       "--actor.micro-batch-size", "64"])
    with pytest.raises(ConfigError, match="algorithm.rollout_batch_size_per_gpu: .* 1 chunks .* 2 actor ranks"):
        check_reasoning_batch_arithmetic(cfg, 1, 1, 2, "test")
    check_reasoning_batch_arithmetic(cfg, 1, 1, 1, "test")  # one actor rank takes the one chunk


def test_two_steps_resume_two_steps_equal_four_straight_bitwise(tiny):
    """runners/base.py's checkpoint for the reasoning half: weights, optimizer, lr schedule, loader, RNG state
    (rng.pt)."""
    tmp, _, _, _ = tiny
    model, one = str(tmp / "model"), {"actor": "0", "rollout,reward": "1"}
    every = ("--runner.save-interval", "2", "--actor.optim.lr-scheduler", "cosine",
             "--actor.optim.total-training-steps", "8")  # 2 optimizer steps a step; resumed, it picks up where it was
    dir_s, hist_s = run(tmp, model, "four_straight", 4, one, *every)
    dir_r, hist_half = run(tmp, model, "two_and_two", 2, one, *every)
    _, hist_rest = run(tmp, model, "two_and_two", 4, one, *every, "--runner.resume-dir", "auto")
    assert sorted(p.name for p in (dir_r / "checkpoints/global_step_2").iterdir()) == ["actor.pt", "rng.pt",
                                                                                       "runner.json"]
    logged = [{k: v for k, v in h.items() if not k.startswith(("time/", "sync/")) and k != "rollout/tokens_per_s"}
              for h in hist_half + hist_rest]
    assert [h["step"] for h in logged] == [1, 2, 3, 4]
    lrs = [h["train/actor/lr"] for h in logged]
    assert lrs[0] < load_config(["--config", CONFIG]).actor.optim.lr and lrs == sorted(lrs, reverse=True)
    assert len(set(lrs)) == 4  # the mean lr of each step's two optimizer steps, down the cosine
    assert logged == [{k: v for k, v in h.items() if k in logged[0]} for h in hist_s]
    a = torch.load(dir_s / "checkpoints/global_step_4/actor.pt", weights_only=True)
    b = torch.load(dir_r / "checkpoints/global_step_4/actor.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for pa, pb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(torch.as_tensor(pa[k]), torch.as_tensor(pb[k])) for k in pa)
    assert json.loads((dir_s / "checkpoints/global_step_4/runner.json").read_text()) == \
        json.loads((dir_r / "checkpoints/global_step_4/runner.json").read_text())


def test_a_nan_step_is_skipped_by_the_shared_actor_core_as_in_the_embodied_half(tiny, monkeypatch):
    """stages/actor_core.py's loop, the reasoning side of tests/test_faults.py's nan_loss_skipped: with
    actor.skip_nonfinite, every optimizer step of the poisoned run_training() call is skipped and counted, the weights
    stay those of the step before, and the next step trains again."""
    tmp, _, _, _ = tiny
    monkeypatch.setenv("RLINF_MINI_FAULT", "group=ActorGroup,method=run_training,call=2,kind=nan")
    run_dir, history = run(tmp, str(tmp / "model"), "nan_skipped", 3, {"actor": "0", "rollout,reward": "1"},
                           "--actor.skip-nonfinite", "--runner.save-interval", "1")
    skipped = [h["train/skipped_steps"] for h in history if "train/skipped_steps" in h]
    assert skipped[0] == skipped[2] == 0 and skipped[1] >= 1, skipped
    assert all(v == v for h in history for k, v in h.items() if k.startswith("train/"))  # no NaN logged
    w1, w2, w3 = (weights(run_dir, s) for s in (1, 2, 3))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)  # the skipped step changed nothing
    assert not all(torch.equal(w2[k], w3[k]) for k in w2)
