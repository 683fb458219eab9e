# %% [markdown]
# # 07 — Reasoning: prompts → sampled responses → a verifier's reward → GRPO → new weights
#
# Run it: `python tutorials/07_reasoning.py` (it warm-starts a tiny GPT-2, takes one step apart, then trains 20 steps;
# its time on 2 cores is in README's tutorial table, which the tests check). Every stated fact is an `assert` in the
# cell after it. Words in doubt: the [glossary](glossary.md).

# %% [markdown]
# ## One step as pseudocode
#
# The step this tutorial takes apart, as pseudocode: one block per phase of `ReasoningRunner.train_step`, in the names
# the code uses (`||`: the calls run at the same time). README's "One step as pseudocode" holds the same box,
# and `tests/test_docs.py` checks every name in it against the code.
#
# ```text
# ReasoningRunner.run(): for global_step in range(runner.max_epochs): train_step()    # rlinf_mini/runners/reasoning.py
#
# 1 prepare_data         loader.next_batch(): data.rollout_batch_size prompts onto the dataloader channel,
#                        in chunks of algorithm.rollout_batch_size_per_gpu prompts
#
# 2 sync_weights         update_rollout_weights()                        (every runner.weight_sync_interval steps)
#     actor.sync_model_to_rollout(weight_handles, version) || rollout.sync_model_from_actor(version)
#
# 3 generate_and_train   the three groups at once, chunk by chunk: a chunk is scored while the next is generated
#     rollout.rollout(...)          generate(model, prompt_ids, ...): algorithm.group_size sampled responses per
#                                   prompt (KV cache, algorithm.sampling_params.temperature) and their logprobs [N, R]
#     reward.compute_rewards(...)   math_reward(response, answers): reward.reward_max_val if the answer is right,
#                                   else reward.reward_min_val
#     actor.run_training(...)
#         advantages = compute_grpo_token_advantages(rewards, response_mask, algorithm.group_size)
#                      # (r - its group's mean) / its group's std, on every response token [N, R]
#         old_logprobs = compute_response_logprobs(model, ...)          # when algorithm.recompute_logprobs
#         ref_logprobs = the frozen reference model's                    # when algorithm.kl_beta > 0
#         for each of algorithm.update_epoch epochs, for each actor.global_batch_size batch, per micro-batch:
#             loss = compute_ppo_actor_loss(logprobs, old_logprobs, advantages, token_weights(...), ...)
#                    # aggregated by algorithm.loss_agg_func
#                    + algorithm.kl_beta * kl_penalty(logprobs, ref_logprobs, algorithm.kl_penalty_type)
#         all-reduce the gradients, clip to actor.optim.clip_grad, one step of actor.optim.lr
#
# then every runner.val_check_interval steps evaluate() (greedy: eval/accuracy), every runner.save_interval steps
# save_checkpoint()
# ```

# %% [markdown]
# ## What this stage does, and why RLinf has it
#
# RLinf's other half trains language models on math with a rule-based reward (`runner.task_type: reasoning`,
# `examples/reasoning/main_grpo.py`). Same runtime as the embodied run — Cluster, placement, worker groups,
# channels, weight sync, checkpoints — but the data is prompts, an episode is one response, and the reward comes
# from checking the answer:
#
#     prompts ──► rollout: G responses per prompt (KV cache, sampled) ──► reward: verify each answer (±1)
#        ──► actor: advantage = (r − group mean) / group std on every response token ──► clipped update ──► sync
#
# No critic: the G responses to the same prompt are each other's baseline (GRPO; the group size G is
# `algorithm.group_size`, 8 here). The rollout, reward and actor
# groups are started together and pass chunks of groups over channels, so a chunk is scored while the next one is
# still being generated.
#
# ## The code to read
#
# - `stages/reasoning_rollout.py`: `plain_generate` (left padding, position ids, the KV-cache loop, inverse-CDF
#   sampling from `counter_uniform`, log-probs) and `generate`, which runs it or, with `rollout.fast_generation` (the
#   default), the same tokens faster: `rlinf_mini/models/fast_generation.py` (one prefill per distinct prompt, the
#   cache in place, finished rows leave the batch; for a Llama such as SmolLM2 `models/llama_decode.py`'s lean
#   forward); `ReasoningRolloutWorker.rollout` / `evaluate`.
# - `stages/reasoning_reward.py`: `extract_answer`, `answers_equal`, `math_reward`, `ReasoningRewardWorker`.
# - `stages/reasoning_train.py`: `compute_grpo_token_advantages`, `compute_response_logprobs`, the loss
#   (`compute_ppo_actor_loss` from `stages/losses.py`, token by token), `ReasoningActorWorker.run_training`.
# - `rlinf_mini/runners/reasoning.py::ReasoningRunner.train_step`, `rlinf_mini/data/`, `rlinf_mini/models/tiny_lm.py`.

# %%
import time

import torch
from workbench import OUT, ROOT, check_exercise, matches

from rlinf_mini.config import load_config
from rlinf_mini.data.prompt_dataset import PromptDataset
from rlinf_mini.models.make_tiny_lm import SFT_STEPS, create_tiny_lm
from rlinf_mini.models.tiny_lm import load_causal_lm
from stages.reasoning_reward import decode_responses, math_reward
from stages.reasoning_rollout import generate
from stages.reasoning_train import compute_grpo_token_advantages, compute_response_logprobs

torch.set_num_threads(1)  # as the warm start and the workers do: at 0.1 M parameters a second thread only waits
RUNS = OUT / "runs"
argv = ["--config", str(ROOT / "configs/math.yaml"), "--runner.logger.log-path", str(RUNS),
        "--runner.logger.experiment-name", "07_reasoning", "--actor.model.model-path", str(OUT / "tiny_lm"),
        "--data.train-data-paths", str(OUT / "data/train.jsonl"), "--data.val-data-paths", str(OUT / "data/val.jsonl"),
        "--runner.max-epochs", "20", "--runner.val-check-interval", "20", "--runner.save-interval", "20"]
cfg = load_config(argv)
start = time.monotonic()
losses = create_tiny_lm(cfg, str(OUT / "tiny_lm"))  # writes the JSONL files, then the supervised steps
print(f"warm start: {time.monotonic() - start:.0f} s (the longest part of this tutorial)")
model, tokenizer = load_causal_lm(OUT / "tiny_lm")
train = PromptDataset.from_files(cfg.data.train_data_paths, cfg.data, tokenizer)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters; supervised loss {losses[0]:.2f} -> {losses[-1]:.2f}")
print("a train prompt:", repr(train.prompts[0]), "answers:", train.answers[0])
assert losses[-1] < losses[0] / 5  # the warm start learned the format (right on under half the sums: see below)
assert len(losses) < SFT_STEPS and cfg.algorithm.group_size == 8  # it stopped at WARM_START_ACCURACY on train sums

# %% [markdown]
# ## Run it
#
# One group: the first train prompt, G = 8 times, sampled at temperature 1. Each response's noise is
# `counter_uniform(seed, sample id, token index)`, a hash: the same sample id gives the same response in any
# batch (checked below: sample 3 generated alone). A second prompt of another length rides along to show the left
# padding: '3+4=', written by hand (the task's prompts are all zero-padded to one length, '03+04=', so that every
# digit keeps its place: `data.arithmetic.zero_pad`).

# %%
G = cfg.algorithm.group_size
short_ids = tokenizer("3+4=", add_special_tokens=False)["input_ids"]  # 4 tokens, prompt 0 has 6
prompts = [train.prompt_ids[0]] * G + [short_ids]
out = generate(model, prompts, torch.arange(G + 1), cfg.algorithm.sampling_params, 4, tokenizer.pad_token_id,
               tokenizer.eos_token_id, seed=cfg.actor.seed)
texts = decode_responses(tokenizer, out["response_ids"], out["response_mask"])
rewards = torch.tensor([math_reward(t, train.answers[0]) for t in texts[:G]])  # [G]: +1 right, -1 wrong
advantages = compute_grpo_token_advantages(rewards, out["response_mask"][:G].float(), G)  # [G, R]
for text, r, a, m in zip(texts, rewards, advantages, out["response_mask"], strict=False):
    print(f"{text!r:>8} reward {float(r):+.0f}  advantage per token {a.tolist()}  mask {m.tolist()}")

# %% [markdown]
# ## What you should see
#
# **The mask covers each response up to and including its `<eos>`**, and the tokens after it are padding.
# **Within the group the advantages sum to zero** on every token position that all responses share, right answers
# positive, wrong ones negative (if the group has both; a group where all agree teaches nothing: advantage 0).
# **The same sample id gives the same response alone as in the batch.**

# %%
mask = out["response_mask"][:G]
for ids, m in zip(out["response_ids"][:G], mask, strict=True):
    n = int(m.sum())
    assert m[:n].all() and not m[n:].any()
    assert ids[n - 1] == tokenizer.eos_token_id or n == mask.shape[1]
shared = int(mask.sum(dim=1).min())  # token positions that every response of the group has
assert torch.allclose(advantages[:, :shared].sum(dim=0), torch.zeros(shared), atol=1e-4)
first = advantages[:, 0]  # every response has a first token
assert ((first > 0) == (rewards > 0)).all() or (rewards == rewards[0]).all()
assert (compute_grpo_token_advantages(torch.ones(G), mask.float(), G) == 0).all()  # all agree: nothing to learn
assert cfg.algorithm.sampling_params.temperature == 1.0
alone = generate(model, [train.prompt_ids[0]], torch.tensor([3]), cfg.algorithm.sampling_params, 4,
                 tokenizer.pad_token_id, tokenizer.eos_token_id, seed=cfg.actor.seed)
n3 = int(out["response_mask"][3].sum())
assert torch.equal(alone["response_ids"][0, :n3], out["response_ids"][3, :n3])

# %% [markdown]
# **The prompts are left-padded and the positions count real tokens only.** The second prompt is shorter, so
# its row starts with pad tokens (attention mask 0), and its response is the one it gets alone, unpadded (same
# sample id). **The actor's recomputation — one forward pass over
# prompt + response, logits for the response positions only — gives the rollout's log-probs** to 1e-5; that is
# what makes the PPO ratio start at 1 (to within 1e-5).

# %%
lengths = out["prompt_mask"].sum(dim=1)  # [G + 1] real prompt tokens per row
n_pad = int(lengths[0] - lengths[G])
assert n_pad > 0 and (out["prompt_ids"][G, :n_pad] == tokenizer.pad_token_id).all()
assert not out["prompt_mask"][G, :n_pad].any() and out["prompt_mask"][G, n_pad:].all()
unpadded = generate(model, [short_ids], torch.tensor([G]), cfg.algorithm.sampling_params, 4,
                    tokenizer.pad_token_id, tokenizer.eos_token_id, seed=cfg.actor.seed)
n_short = int(out["response_mask"][G].sum())
assert unpadded["prompt_mask"].all() and torch.equal(unpadded["response_ids"][0, :n_short],
                                                     out["response_ids"][G, :n_short])
with torch.no_grad():
    recomputed = compute_response_logprobs(model, out["prompt_ids"], out["prompt_mask"], out["response_ids"],
                                           out["response_mask"], cfg.algorithm.sampling_params.temperature)
assert torch.allclose(recomputed, out["logprobs"], atol=1e-5)

# %% [markdown]
# **Training raises held-out exact match** in 20 steps: from 0.35-0.55 (the warm start) by at least 0.02 (three
# seeds: +0.18, +0.18, +0.02; 512 held-out sums move about ±0.02 by chance; these are the first 20 of the default
# run's 500 steps, whose cosine schedule has barely begun: `--runner.max-epochs 20` is applied after the file's
# `${runner.max_epochs}` was resolved, so total_training_steps stays 500). The whole run
# through the runtime: `ReasoningRunPlan` (placement of actor, rollout and reward; batch arithmetic; datasets),
# then the three groups and `ReasoningRunner`, 20 steps of 16 prompts × 8 responses, evaluated greedily on the
# 512 held-out sums before and after.

# %%
import shutil

from rlinf_mini.train import ReasoningRunPlan, build_and_run

shutil.rmtree(RUNS / "07_reasoning", ignore_errors=True)  # a run folder holds one run: start afresh
plan = ReasoningRunPlan(cfg, "07_reasoning")
history = build_and_run(cfg, plan)
accuracy = [h["eval/accuracy"] for h in history if "eval/accuracy" in h]
print(f"held-out exact match: {accuracy[0]:.3f} before -> {accuracy[-1]:.3f} after {len(history) - 1} steps")
assert (cfg.data.rollout_batch_size, G, len(plan.val_set)) == (16, 8, 512)
assert [h["step"] for h in history if "eval/accuracy" in h] == [0, 20] and len(history) == 21
assert 0.35 <= accuracy[0] <= 0.55 and accuracy[-1] >= accuracy[0] + 0.02
assert (plan.run_dir / "learning_curve.png").is_file()

# %% [markdown]
# **A chunk is scored while the next one is generated**, and the trace shows it. With `runner.trace` (on by
# default) every worker records what it did when (`rlinf_mini/scheduler/tracer.py`): the rollout one `generate`
# span per chunk, the reward one `score` span per chunk, the actor its `logprobs`, `forward_backward` and
# `optimizer_step`, and every blocking channel wait. `trace.json` in the run folder (the first 20 steps) opens in
# chrome://tracing or https://ui.perfetto.dev; `timeline.png` draws the last traced step, one row per worker.
# Below, by the order of events (not by a share of wall time, which load changes): the reward scores chunk c only
# after the rollout has generated it, and in the traced steps the reward starts scoring chunk 0 before the rollout
# has finished generating the step's last chunk — a schedule without the pipeline (score after generate, step by
# step) never does. How often it does depends on the machine: the reward shares core 1 with the rollout here
# (`rollout,reward: 1`), so it may score a chunk only after the rollout has moved on.

# %%
import json

events = [e for e in json.loads((plan.run_dir / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
work = {e["name"] for e in events}
assert {"generate", "score", "logprobs", "forward_backward", "optimizer_step"} <= work
assert (plan.run_dir / "timeline.png").is_file()
chunks = cfg.data.rollout_batch_size // cfg.algorithm.rollout_batch_size_per_gpu  # per step


def chunk_spans(name: str) -> list[tuple[float, float, int]]:
    """(start, end, chunk) of every span `name`, in time order: step after step, chunks 0..chunks-1 each."""
    return sorted((e["ts"], e["ts"] + e["dur"], e["args"]["stage"]) for e in events if e["name"] == name)


generated, scored = chunk_spans("generate"), chunk_spans("score")
assert len(generated) == len(scored) == 20 * chunks
assert [c for _, _, c in generated] == [c for _, _, c in scored] == list(range(chunks)) * 20
steps = [(generated[i:i + chunks], scored[i:i + chunks]) for i in range(0, len(generated), chunks)]
for gen, score in steps:  # causality: a chunk is scored after it is generated
    assert all(g1 <= s0 for (_, g1, _), (s0, _, _) in zip(gen, score, strict=True))
pipelined = sum(score[0][0] < gen[-1][1] for gen, score in steps)  # chunk 0 scored before the last is generated
print(f"steps whose chunk 0 was scored while the rollout still generated: {pipelined} of {len(steps)}")
assert pipelined >= 1

# %% [markdown]
# ## KL to a reference model
#
# `algorithm.kl_beta > 0` (`configs/math_kl.yaml`; RLinf's, TRL's and veRL's "KL loss") keeps a frozen copy of the
# starting model in the actor, the reference, and adds kl_beta × the mean over response tokens of
# `kl_penalty(logprobs, ref_logprobs, "low_var_kl")` to the loss: e^(ref − logp) − (ref − logp) − 1 (Schulman's
# k3, ≥ 0, 0 only where the two agree), logged as `train/actor/kl_loss`. It pulls the policy back towards where it
# started.
# Two runs of the same 20 steps side by side, kl_beta 0 (the run above) and 0.5, each measured afterwards
# against the warm start on its own sampled answers to the held-out prompts: **with the penalty the policy stays
# closer to the reference** (three seeds: 0.32-0.40 of the KL without it; 0.75 or less asserted), and it still
# learns (held-out +0.12 to +0.18 in the same 20 steps).

# %%
import copy

from stages.losses import kl_penalty

KL_BETA = 0.5
kl_cfg = load_config(argv + ["--algorithm.kl-beta", str(KL_BETA), "--runner.logger.experiment-name",
                             "07_reasoning_kl"])
shutil.rmtree(RUNS / "07_reasoning_kl", ignore_errors=True)
kl_plan = ReasoningRunPlan(kl_cfg, "07_reasoning_kl")
kl_history = build_and_run(kl_cfg, kl_plan)


def trained(run_dir):
    """The run's policy after its 20 steps (its checkpoint), beside the warm start `model`, the reference."""
    policy = copy.deepcopy(model)
    policy.load_state_dict(torch.load(run_dir / "checkpoints/global_step_20/actor.pt", weights_only=True)["model"])
    return policy


def kl_to_reference(policy) -> float:
    """KL(policy || warm start) per response token: k3 on the policy's own samples of the held-out prompts."""
    prompts = plan.val_set.prompt_ids
    out = generate(policy, prompts, torch.arange(len(prompts)), cfg.algorithm.sampling_params, 4,
                   tokenizer.pad_token_id, tokenizer.eos_token_id, seed=0)
    args = (out["prompt_ids"], out["prompt_mask"], out["response_ids"], out["response_mask"], 1.0)
    with torch.no_grad():
        kl = kl_penalty(compute_response_logprobs(policy, *args), compute_response_logprobs(model, *args),
                        "low_var_kl")  # [N, R]
    mask = out["response_mask"].float()
    return float((kl * mask).sum() / mask.sum())


kl_without, kl_with = kl_to_reference(trained(plan.run_dir)), kl_to_reference(trained(kl_plan.run_dir))
kl_accuracy = [h["eval/accuracy"] for h in kl_history if "eval/accuracy" in h]
print(f"kl_beta 0:     KL to the reference {kl_without:.4f}, held-out {accuracy[0]:.3f} -> {accuracy[-1]:.3f}")
print(f"kl_beta {KL_BETA}: KL to the reference {kl_with:.4f}, held-out {kl_accuracy[0]:.3f} -> {kl_accuracy[-1]:.3f}"
      f" (train/actor/kl_loss at the last step {kl_history[-1]['train/actor/kl_loss']:.4f})")
# no reference model without the penalty
assert "train/actor/kl_loss" not in history[-1] and kl_history[-1]["train/actor/kl_loss"] > 0
assert kl_with <= 0.75 * kl_without and kl_accuracy[-1] >= kl_accuracy[0] + 0.02

# %% [markdown]
# ## One option's effect: dynamic sampling
#
# A group whose G rewards are all equal (all right, or all wrong) has advantage 0 on every token: it cost G
# responses and teaches nothing. `algorithm.max_resample > 0` is DAPO's dynamic sampling
# (`stages/dynamic_sampling.py`; the other GRPO options are in `docs/grpo_options.md`): such groups are dropped and
# their slots refilled with groups for the loader's next prompts, for up to max_resample rounds a step. The same 20
# steps as the first run, with max_resample 5: **all-equal groups are common at the warm start** (dropped on most
# steps), **a step refills them in one round or a few** (at most 5), and **the actor trains on no all-equal group**
# (none kept after the last round, at any step); the plain run logs none of these counts. What it buys over a full
# run, 3 seeds (held-out accuracy and pass@4, time): `docs/grpo_options.md`, from `python -m benchmarks.grpo_options`.

# %%
ds_cfg = load_config(argv + ["--algorithm.max-resample", "5", "--runner.logger.experiment-name", "07_reasoning_ds"])
shutil.rmtree(RUNS / "07_reasoning_ds", ignore_errors=True)
ds_history = build_and_run(ds_cfg, ReasoningRunPlan(ds_cfg, "07_reasoning_ds"))
ds_steps = ds_history[1:]  # step 0 is the first evaluation
dropped = [int(h["rollout/dropped_groups"]) for h in ds_steps]
rounds = [int(h["rollout/resample_rounds"]) for h in ds_steps]
kept = [int(h["rollout/constant_groups_kept"]) for h in ds_steps]
print(f"all-equal groups dropped per step, over its rounds (of {cfg.data.rollout_batch_size} a batch): {dropped}")
print(f"held-out exact match after 20 steps: {accuracy[-1]:.3f} without, "
      f"{ds_history[-1]['eval/accuracy']:.3f} with dynamic sampling (one seed)")
print(f"refill rounds per step: {rounds}; all-equal groups trained on: {sum(kept)}")
assert len(ds_steps) == 20 and sum(d > 0 for d in dropped) >= 10  # common at the warm start
assert all((r > 0) == (d > 0) and r <= ds_cfg.algorithm.max_resample for r, d in zip(rounds, dropped, strict=True))
assert kept == [0] * 20  # every group the actor trained on had a signal (one left after 5 rounds is rare: ~0.2^5)
assert all("rollout/dropped_groups" not in h for h in history)  # the plain run: off, nothing counted

# %% [markdown]
# ## The RLinf counterpart
#
# - `rlinf/runners/reasoning_runner.py::ReasoningRunner.run` (`_put_batch`, `_sync_weights`, rollout ∥ reward ∥
#   actor over channels) → `rlinf_mini/runners/reasoning.py`
# - `rlinf/workers/rollout/` (SGLang / vLLM engines) → `stages/reasoning_rollout.py::generate` on the HF model
# - `rlinf/workers/reward/reward_worker.py`, `rlinf/algorithms/rewards/math/` → `stages/reasoning_reward.py`
# - `rlinf/algorithms/advantages.py::compute_grpo_advantages`, `rlinf/algorithms/losses.py`,
#   `rlinf/workers/actor/fsdp_actor_worker.py` → `stages/reasoning_train.py`
# - `rlinf/data/datasets/reasoning/dataset.py` (prompt_key / answer_key) → `rlinf_mini/data/`
#
# ## Exercise
#
# Write GRPO's token advantages: `my_grpo_advantages(rewards [N], response_mask [N, R], group_size)` → [N, R]:
# each response's reward minus its group's mean, divided by the group's (unbiased) std + 1e-6, on every token of
# the response and 0 on padding. Replace the body. Each case is named for what it tests: an answer that
# normalizes over the whole batch instead of each group of `group_size` passes "one group" and fails "two groups
# of 4"; one that forgets the mask fails "responses of different lengths"; one without the + 1e-6 fails "a group
# whose rewards all agree" (0 / 0).

# %%
def my_grpo_advantages(rewards, response_mask, group_size):
    # EXERCISE: replace the line below with your own code.
    return compute_grpo_token_advantages(rewards, response_mask, group_size)


def case(seed: int, groups: int, G: int, R: int, ragged: bool):
    """groups x G responses of rewards +1 / -1 and up to R tokens (all R unless ragged)."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (groups * G,), generator=g).float() * 2 - 1
    lengths = torch.randint(1, R + 1, (groups * G, 1), generator=g) if ragged else torch.full((groups * G, 1), R)
    return rewards, (torch.arange(R) < lengths).float(), G


CASES = {
    "one group of 4, full-length responses": case(1, 1, 4, 3, ragged=False),
    "responses of different lengths": case(2, 1, 4, 5, ragged=True),
    "two groups of 4": case(3, 2, 4, 3, ragged=False),
    "a group whose rewards all agree": (torch.tensor([1.0, 1, 1, 1, -1, 1, -1, -1]), torch.ones(8, 2), 4),
    "three groups of 8, one-token responses": case(5, 3, 8, 1, ragged=False),
    "groups of 2, scaled rewards": (torch.tensor([0.5, 2.0, -3.0, 1.0, 0.0, 0.0]), torch.ones(6, 3), 2),
}
check_exercise(my_grpo_advantages, compute_grpo_token_advantages, CASES)


def forgets_the_groups(rewards, response_mask, group_size):
    return compute_grpo_token_advantages(rewards, response_mask, len(rewards))


one_group = {"one group": CASES["one group of 4, full-length responses"]}
assert matches(forgets_the_groups, compute_grpo_token_advantages, one_group)  # one group: right by accident
assert not matches(forgets_the_groups, compute_grpo_token_advantages, CASES)  # a wrong answer fails
