# %% [markdown]
# # 05 — Training: the actor's PPO update, batch by batch
#
# Run it: `python tutorials/05_training.py` (it starts no process; its time on 2 cores is in README's tutorial table,
# which the tests check). Every stated fact is an `assert` in the cell after it. Words in doubt: the
# [glossary](glossary.md).
#
# ## What this stage does, and why RLinf has it
#
# The actor ranks receive the step's trajectories, compute advantages (tutorial 04), and run `update_epoch` passes
# over them. Each pass cuts the rollout batch into **global batches** (one optimizer step each, summed over all
# actor ranks); each rank's share of a global batch is fed in **micro-batches** whose gradients accumulate before
# the step. So `global_batch_size` is an algorithm choice (how many samples per update) and `micro_batch_size` is a
# memory choice (how many samples one forward/backward holds) — users of RLinf and its peers often ask how these
# relate (verl#1524, OpenRLHF#304). With several actor ranks the ranks average their accumulated gradients with
# one all-reduce before each optimizer step (what DistributedDataParallel does, without its wrapper).
#
# The loss is PPO's clipped surrogate with RLinf's **dual clip** (for negative advantages the loss is capped at
# −A·c, so one action whose probability exploded cannot dominate), plus RLinf's clipped Huber value loss. The
# whole update as pseudocode (Spinning Up style; W actor ranks, each holding N of the step's samples):
#
#     for epoch = 1 .. update_epoch:
#         shuffle this rank's N samples
#         for each global batch (global_batch_size / W samples on this rank):          # one optimizer step
#             zero the gradients
#             for each micro-batch (micro_batch_size samples), accum of them:
#                 ratio    = exp(logp(a|s) − old_logp)                                  # per sample
#                 pg       = max(−A·ratio, −A·clip(ratio, 1 − ε_low, 1 + ε_high));  where A < 0: min(pg, −A·c)
#                 V_clip   = V_old + clip(V − V_old, −value_clip, value_clip)
#                 v        = max(huber(R − V), huber(R − V_clip))
#                 huber(e) = ½ e² where |e| < huber_delta, else huber_delta · (|e| − huber_delta / 2)
#                 loss     = mean_mask(pg) − entropy_bonus · mean_mask(entropy) + value_loss_coef · mean_mask(v)
#                            (+ kl_beta · mean_mask(kl) when kl_beta > 0)
#                 backward(loss / accum)                                                # gradients add up
#             average the gradients over the W ranks (one all-reduce)
#             clip the gradient norm at clip_grad;  optimizer step
#
# where mean_mask is the mean over the micro-batch's samples whose loss mask is 1.
#
# ## The code to read
#
# - `stages/losses.py`: `compute_ppo_actor_loss`, `compute_ppo_critic_loss`, `huber_loss`, `kl_penalty`.
# - `stages/train.py`: `update_policy` (epochs → global batches → micro-batches, `loss / accum` before `backward`,
#   one gradient all-reduce per step), `compute_micro_batch_loss`; `ActorWorker.run_training` calls them.
# - `rlinf_mini/config/checks.py::check_batch_arithmetic`: the divisibility rules, checked before any process starts.

# %%
import contextlib
import dataclasses
import io
import math

import torch
from workbench import ROOT, check_exercise, matches

from rlinf_mini.config import load_config
from rlinf_mini.train import main
from stages.losses import compute_ppo_critic_loss
from stages.train import ActorWorker, compute_micro_batch_loss, compute_ppo_actor_loss, flatten_batch

MLP = str(ROOT / "configs/embodied_mlp.yaml")

# %% [markdown]
# ## Run it (1): the batch arithmetic of a config, with `--explain`
#
# `python -m rlinf_mini.train --config configs/embodied_mlp.yaml --explain` prints the plan; here its training part.

# %%
def explain(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--config", MLP, *args, "--explain"])
    return code, out.getvalue()


code, plan = explain()
print(plan[plan.index("5 training"):])

# %% [markdown]
# ## What you should see (1)
#
# 32 envs × 32 chunk steps = 1024 samples per step, 512 on each of the 2 actor ranks. A global batch of 256 is 128
# per rank, one micro-batch of 128: 1 gradient-accumulation step. 1024 / 256 = 4 optimizer steps per pass, × 4
# passes (`update_epoch`) = 16 optimizer steps per training step. A micro-batch of 32 makes it 4 accumulation
# steps, with the same 16 optimizer steps.

# %%
assert code == 0
for line in ("32 / 2 = 16 trajectories per actor rank", "per actor rank: 16 x 32 = 512 samples",
             "256 / 2 = 128 samples per rank per optimizer step", "128 / 128 = 1 gradient-accumulation steps",
             "x update_epoch 4 = 16 optimizer steps per training step"):
    assert line in plan, line
code, plan32 = explain("--actor.micro-batch-size", "32")
assert code == 0 and "128 / 32 = 4 gradient-accumulation steps" in plan32
assert "x update_epoch 4 = 16 optimizer steps per training step" in plan32

# %% [markdown]
# A micro-batch of 96 cannot work: 2 ranks × 96 does not divide 256. `--explain` names the number that breaks and
# two settings near it that pass every check (a training run stops with the same one-line error, exit code 2):

# %%
code, broken = explain("--actor.micro-batch-size", "96")
print(broken[broken.index("breaks"):])
assert code == 2 and "breaks: actor.global_batch_size = 256" in broken
fixes = [line.split() for line in broken.split("pass every check:\n")[1].strip().splitlines()]
assert fixes == [["--actor.micro-batch-size", "64"], ["--actor.micro-batch-size", "128"]]
assert all(explain("--actor.micro-batch-size", "96", *fix)[0] == 0 for fix in fixes)
err = io.StringIO()
with contextlib.redirect_stderr(err):  # a training run: the same check, before any process starts
    code = main(["--config", MLP, "--actor.micro-batch-size", "96"])
assert code == 2 and err.getvalue().count("\n") == 1
assert "actor.global_batch_size: 256 is not divisible by micro_batch_size x actor ranks = 96 x 2" in err.getvalue()

# %% [markdown]
# ## Run it (2): micro-batches change memory, and the update only where a loss mask is ragged
#
# A real `ActorWorker`, built in this process (the runtime normally sets `_rank`, `_world_size`, `_group_name` and
# `device` before `__init__`; here we do), trained on the same batch with micro-batch 64 (no accumulation) and
# micro-batch 16 (4 accumulated micro-batches per optimizer step) — once with `env.train.auto_reset: true` (the
# config's: every sample counts, no loss mask) and once with `auto_reset: false`, where the actor masks every step
# after an env's first done (RLinf's `compute_loss_mask`), so micro-batches hold different numbers of counted
# samples. A hook on the optimizer counts its steps.

# %%
cfg = load_config(["--config", MLP, "--env.train.total-num-envs", "16", "--env.train.max-steps-per-rollout-epoch",
                   "8", "--actor.global-batch-size", "64", "--actor.micro-batch-size", "64"])
T, B = 8, 16
torch.manual_seed(0)
obs = torch.randn(T, B, 4)  # [T, B, obs_dim]: the fake reach env's observations are 4 numbers


def make_actor(micro_batch_size: int, auto_reset: bool = True) -> ActorWorker:
    c = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, micro_batch_size=micro_batch_size),
                            env=dataclasses.replace(cfg.env, train=dataclasses.replace(cfg.env.train,
                                                                                       auto_reset=auto_reset)))
    worker = ActorWorker.__new__(ActorWorker)
    worker._rank, worker._world_size, worker._group_name, worker.device = 0, 1, "ActorGroup", torch.device("cpu")
    worker.__init__(c)
    worker.init_worker({"env": 1, "rollout": 1, "actor": 1})
    return worker


reference_actor = make_actor(64)
initial = reference_actor.get_state_dict()
with torch.no_grad():  # a batch as the rollout would produce it, with the initial weights
    out = reference_actor.policy.predict_action_batch(obs.reshape(T * B, 4), torch.rand(T * B, 2), mode="train")
reference_actor.close()
batch = {
    "obs": obs, "actions": out["actions"].reshape(T, B, 1, 2), "logprobs": out["logprobs"].reshape(T, B),
    "values": torch.randn(T + 1, B), "rewards": torch.randn(T, B), "dones": torch.rand(T, B) < 0.1,
    "versions": torch.zeros(T, B, dtype=torch.int64),
}
results = {}
for auto_reset in (True, False):
    for micro in (64, 16):
        actor = make_actor(micro, auto_reset)
        steps = []
        actor.optimizer.register_step_post_hook(lambda *_, steps=steps: steps.append(1))
        actor.batch = {k: v.clone() for k, v in batch.items()}
        actor.compute_advantages_and_returns()
        metrics = actor.run_training()
        results[micro, auto_reset] = (actor.get_state_dict(), metrics, len(steps), actor.batch["loss_mask"])
        actor.close()


def max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


moved = max_diff(results[64, True][0], initial)
diff = max_diff(results[64, True][0], results[16, True][0])
diff_masked = max_diff(results[64, False][0], results[16, False][0])
print(f"{results[64, True][2]} optimizer steps; weights moved by up to {moved:.2e}; micro 64 vs micro 16 differ by "
      f"{diff:.2e} without a loss mask, {diff_masked:.2e} with the first-episode mask")

# %% [markdown]
# ## What you should see (2)
#
# 8 optimizer steps (128 samples / 64 per step × 4 epochs), after which the weights have moved by more than
# 1e-3. **Without a loss mask the two runs agree to float32 rounding** (below 1e-5, far below the change):
# `update_policy` backpropagates `loss / 4` for each of the 4 micro-batches, and a mean of 4 means over 16
# samples each is the mean over the 64. **With a ragged loss mask they do not** (a difference of the order of
# the change itself): each micro-batch's loss is the mean over *its own* counted samples, so accumulation weighs
# every micro-batch 1/4 however many samples it counts, while the whole batch weighs every counted sample alike.

# %%
assert all(r[2] == 8 for r in results.values())
assert moved > 1e-3
assert results[64, True][3].all() and not results[64, False][3].all()  # auto_reset true: no mask; false: ragged
assert diff < 1e-5
assert abs(results[64, True][1]["train/actor/policy_loss"] - results[16, True][1]["train/actor/policy_loss"]) < 1e-5
assert diff_masked > 100 * diff and diff_masked > moved / 10

# %% [markdown]
# The rule exactly, on one optimizer step's 64 samples of the masked batch and the real loss
# (`compute_micro_batch_loss`): with n_m counted samples in micro-batch m and g_m the gradient of its loss, the
# whole batch's gradient is Σ n_m g_m / Σ n_m, and accumulation gives Σ g_m / 4. The two are equal exactly when
# every micro-batch counts the same number of samples: always without a loss mask (GAE with `auto_reset: true`,
# the default), not in general with one (`auto_reset: false`, and GRPO and Reinforce++, which always train each
# env's first episode only). The same holds for the W actor ranks, whose gradients are averaged with equal weights.

# %%
masked = make_actor(64, auto_reset=False)
masked.batch = {k: v.clone() for k, v in batch.items()}
masked.compute_advantages_and_returns()
flat = flatten_batch(masked.batch)


def gradient(idx: torch.Tensor) -> torch.Tensor:
    masked.policy.zero_grad()
    compute_micro_batch_loss(masked.policy, {k: v[idx] for k, v in flat.items()}, masked.cfg)[0].backward()
    return torch.cat([p.grad.reshape(-1) for p in masked.policy.parameters() if p.grad is not None])


parts = torch.arange(64).chunk(4)  # 4 micro-batches of 16
counted = torch.stack([flat["loss_mask"][i].sum() for i in parts])  # [4] n_m
g_whole, g_parts = gradient(torch.arange(64)), torch.stack([gradient(i) for i in parts])  # [P], [4, P]
print("counted samples per micro-batch:", counted.tolist())
assert len(set(counted.tolist())) > 1  # ragged
assert torch.allclose(g_whole, (counted[:, None] * g_parts).sum(0) / counted.sum(), atol=1e-6)
assert not torch.allclose(g_whole, g_parts.mean(0), atol=1e-4)
masked.close()

# %% [markdown]
# ## Run it (3): the clips, sample by sample
#
# The per-sample loss of a few hand-picked cases (ε = 0.2, c = 3). With A = +1 and a ratio of 10 the loss stops at
# −1.2 (the ratio is clipped at 1.2); with A = −1 and a ratio of 10 the plain PPO loss would be 10, and the dual
# clip caps it at −A·c = 3. In both clipped cases the gradient with respect to the log-probability is 0: a clipped
# sample does not push the policy further.

# %%
def ppo(ratio: float, adv: float) -> tuple[float, float]:
    logp = torch.tensor([torch.log(torch.tensor(ratio)).item()], requires_grad=True)
    loss, _ = compute_ppo_actor_loss(logp, torch.zeros(1), torch.tensor([adv]), torch.ones(1), 0.2, 0.2, 3.0)
    loss.backward()
    return round(loss.item(), 5), logp.grad.item()


for ratio, adv in [(10.0, 1.0), (10.0, -1.0), (0.5, 1.0), (1.1, -1.0)]:
    print(f"ratio {ratio:5}, A {adv:+}: loss, d loss / d logp = {ppo(ratio, adv)}")
assert ppo(10.0, 1.0) == (-1.2, 0.0)
assert ppo(10.0, -1.0) == (3.0, 0.0)
assert ppo(0.5, 1.0)[0] == -0.5  # below the clip with A > 0: the unclipped (pessimistic) term counts
assert ppo(1.1, -1.0)[0] == 1.1 and ppo(1.1, -1.0)[1] != 0.0  # inside the clip range: plain -A * ratio

# %% [markdown]
# The value loss takes the larger of the clipped and unclipped errors: a value head that jumps from V_old = 0 to
# V = 1 towards a return of 1 is still charged as if it had moved only 0.2: ½ (0.2 − 1)² = 0.32. With
# huber_delta = 0.5 the error of 0.8 is past the quadratic part: 0.5 · (0.8 − 0.25) = 0.275.

# %%
def v_loss(huber_delta: float) -> float:
    one, zero = torch.tensor([1.0]), torch.tensor([0.0])
    return compute_ppo_critic_loss(one, zero, one, torch.ones(1), 0.2, huber_delta)[0].item()


assert abs(v_loss(10.0) - 0.32) < 1e-6 and abs(v_loss(0.5) - 0.275) < 1e-6

# %% [markdown]
# **The code equals the pseudocode at the top.** The per-sample lines of the pseudocode as a plain Python loop (an
# oracle: floats, no tensors), against `compute_ppo_actor_loss` and `compute_ppo_critic_loss` on 256 random
# samples with a loss mask, asymmetric clip bounds and a dual clip.

# %%
def ppo_losses_from_the_pseudocode(logp, old_logp, adv, mask, eps_low, eps_high, c, V, V_old, R, value_clip, delta):
    def huber(e):
        return 0.5 * e * e if abs(e) < delta else delta * (abs(e) - delta / 2)

    pg_sum = v_sum = count = 0.0
    for i in range(len(adv)):
        if mask[i] == 0:
            continue
        ratio = math.exp(logp[i] - old_logp[i])
        pg = max(-adv[i] * ratio, -adv[i] * min(max(ratio, 1 - eps_low), 1 + eps_high))
        if adv[i] < 0:
            pg = min(pg, -adv[i] * c)
        V_clip = V_old[i] + min(max(V[i] - V_old[i], -value_clip), value_clip)
        pg_sum += pg
        v_sum += max(huber(R[i] - V[i]), huber(R[i] - V_clip))
        count += 1
    return pg_sum / count, v_sum / count


g = torch.Generator().manual_seed(5)
logp, old_logp, adv, V, V_old, R = (torch.randn(256, generator=g) for _ in range(6))
loss_mask = (torch.rand(256, generator=g) < 0.7).float()
pg_oracle, v_oracle = ppo_losses_from_the_pseudocode(*(x.tolist() for x in (logp, old_logp, adv, loss_mask)),
                                                     0.2, 0.28, 3.0, V.tolist(), V_old.tolist(), R.tolist(), 0.2, 0.5)
pg_real = compute_ppo_actor_loss(logp, old_logp, adv, loss_mask, 0.2, 0.28, 3.0)[0]
v_real = compute_ppo_critic_loss(V, V_old, R, loss_mask, 0.2, 0.5)[0]
assert abs(pg_real.item() - pg_oracle) < 1e-5 and abs(v_real.item() - v_oracle) < 1e-5

# %% [markdown]
# ## The RLinf counterpart
#
# - `rlinf/workers/actor/embodied_fsdp_actor_worker.py::EmbodiedFSDPActor`: `recv_rollout_trajectories`,
#   `compute_advantages_and_returns`, `run_training` (shuffle, global batches of `global_batch_size // world_size`,
#   micro-batches with gradient accumulation, `optimizer_step` with `clip_grad`), FSDP instead of one all-reduce.
# - `rlinf/algorithms/losses.py`: `compute_ppo_actor_loss` (asymmetric `clip_ratio_low` / `clip_ratio_high`, dual
#   clip `clip_ratio_c`), `compute_ppo_critic_loss` (clipped Huber); `rlinf/algorithms/registry.py::policy_loss`.
# - `rlinf/config.py::validate_embodied_cfg`: RLinf's divisibility rules (our `check_batch_arithmetic`).
# - Left out here: FSDP sharding, LoRA, offload, LR schedules.
#
# ## Exercise
#
# Implement the PPO policy loss with dual clip: `my_ppo_loss(logprobs, old_logprobs, advantages, clip_low,
# clip_high, clip_c)` returning the mean loss over the samples (all inputs [N]). Replace the body. Each case is
# named for what it tests: a loss without the dual clip fails "dual clip c = 3: ..."; one that clips both sides
# at 1 ± clip_low fails "asymmetric clip ..."; one that caps positive advantages too fails the first case.

# %%
def reference_ppo_loss(logprobs, old_logprobs, advantages, clip_low, clip_high, clip_c):
    mask = torch.ones_like(advantages)
    return compute_ppo_actor_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, clip_c)[0]


def my_ppo_loss(logprobs, old_logprobs, advantages, clip_low, clip_high, clip_c):
    # EXERCISE: replace the line below with the formulas at the top of this tutorial.
    return reference_ppo_loss(logprobs, old_logprobs, advantages, clip_low, clip_high, clip_c)


def case(seed: int, n: int, spread: float, adv_sign: float, clip_low: float, clip_high: float, clip_c: float):
    """n samples with log-ratios ~ N(0, spread^2); advantages of one sign (adv_sign +1 or -1) or both (0)."""
    g = torch.Generator().manual_seed(seed)
    old_logprobs = torch.randn(n, generator=g)
    advantages = torch.randn(n, generator=g)
    if adv_sign:
        advantages = advantages.abs() * adv_sign
    return old_logprobs + spread * torch.randn(n, generator=g), old_logprobs, advantages, clip_low, clip_high, clip_c


CASES = {
    "ratios inside the clip range": case(0, 64, 0.05, 0.0, 0.2, 0.2, 3.0),
    "A > 0, ratios far from 1 (symmetric clip 0.2)": case(1, 64, 2.0, +1.0, 0.2, 0.2, 3.0),
    "asymmetric clip (low 0.2, high 0.28), no dual clip reached": case(2, 128, 0.5, 0.0, 0.2, 0.28, 10.0),
    "dual clip c = 3: A < 0, ratios far above 1": case(3, 64, 2.0, -1.0, 0.2, 0.2, 3.0),
    "everything at once (low 0.1, high 0.3, c = 1.5)": case(4, 256, 1.0, 0.0, 0.1, 0.3, 1.5),
}
check_exercise(my_ppo_loss, reference_ppo_loss, CASES)


def without_dual_clip(logprobs, old_logprobs, advantages, clip_low, clip_high, clip_c):
    return reference_ppo_loss(logprobs, old_logprobs, advantages, clip_low, clip_high, float("inf"))


assert not matches(without_dual_clip, reference_ppo_loss, CASES)  # a wrong answer fails
