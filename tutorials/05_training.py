# %% [markdown]
# # 05 — Training: the actor's PPO update, batch by batch
#
# Run it: `python tutorials/05_training.py` (5–15 s on a 2-core CPU; it starts no process). Every stated fact
# is an `assert` in the cell after it.
# Terms: [the glossary](glossary.md).
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
# −A·c, so one action whose probability exploded cannot dominate), plus RLinf's clipped Huber value loss:
#
#     ratio    = exp(logp − old_logp)
#     pg_loss  = max(−A·ratio, −A·clip(ratio, 1 − ε_low, 1 + ε_high)),  and where A < 0: min(that, −A·c)
#     v_loss   = max(huber(R − V), huber(R − V_clip)),   V_clip = V_old + clip(V − V_old, ±value_clip)
#     huber(e) = ½ e² where |e| < huber_delta, else huber_delta · (|e| − huber_delta / 2)
#
# ## The code to read
#
# - `stages/losses.py`: `compute_ppo_actor_loss`, `compute_ppo_critic_loss`, `huber_loss`, `kl_penalty`.
# - `stages/train.py`: `update_policy` (epochs → global batches → micro-batches, `loss / accum` before `backward`,
#   one gradient all-reduce per step), `compute_micro_batch_loss`; `ActorWorker.run_training` calls them.
# - `rlinf_mini/config.py::check_batch_arithmetic`: the divisibility rules, checked before any process starts.

# %%
import contextlib
import dataclasses
import io

import torch
from workbench import ROOT, check_exercise, matches

from rlinf_mini.config import load_config
from rlinf_mini.train import main
from stages.losses import compute_ppo_critic_loss
from stages.train import ActorWorker, compute_ppo_actor_loss

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

# %% [markdown]
# ## Run it (2): micro-batches change memory, not the update
#
# A real `ActorWorker`, built in this process (the runtime normally sets `_rank`, `_world_size`, `_group_name` and
# `device` before `__init__`; here we do), trained on the same batch twice: micro-batch 64 (no accumulation) and
# micro-batch 16 (4 accumulated micro-batches per optimizer step).

# %%
cfg = load_config(["--config", MLP, "--env.train.total-num-envs", "16", "--env.train.max-steps-per-rollout-epoch",
                   "8", "--actor.global-batch-size", "64", "--actor.micro-batch-size", "64"])
T, B = 8, 16
torch.manual_seed(0)
obs = torch.randn(T, B, 4)  # [T, B, obs_dim]: the fake reach env's observations are 4 numbers


def make_actor(micro_batch_size: int) -> ActorWorker:
    c = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, micro_batch_size=micro_batch_size))
    worker = ActorWorker.__new__(ActorWorker)
    worker._rank, worker._world_size, worker._group_name, worker.device = 0, 1, "ActorGroup", torch.device("cpu")
    worker.__init__(c)
    worker.init_worker({"env": 1, "rollout": 1, "actor": 1})
    return worker


reference_actor = make_actor(64)
with torch.no_grad():  # a batch as the rollout would produce it, with the initial weights
    out = reference_actor.policy.predict_action_batch(obs.reshape(T * B, 4), torch.rand(T * B, 2), mode="train")
batch = {
    "obs": obs, "actions": out["actions"].reshape(T, B, 1, 2), "logprobs": out["logprobs"].reshape(T, B),
    "values": torch.randn(T + 1, B), "rewards": torch.randn(T, B), "dones": torch.rand(T, B) < 0.1,
    "versions": torch.zeros(T, B, dtype=torch.int64),
}
results = {}
for micro in (64, 16):
    actor = make_actor(micro)
    actor.batch = {k: v.clone() for k, v in batch.items()}
    actor.compute_advantages_and_returns()
    metrics = actor.run_training()
    results[micro] = (actor.get_state_dict(), metrics)
    actor.close()
reference_actor.close()
diff = max((results[64][0][k] - results[16][0][k]).abs().max().item() for k in results[64][0])
initial = reference_actor.get_state_dict()
moved = max((results[64][0][k] - initial[k]).abs().max().item() for k in initial)
print(f"weights moved by up to {moved:.2e}; micro 64 vs micro 16 differ by at most {diff:.2e}")

# %% [markdown]
# ## What you should see (2)
#
# After 8 optimizer steps (128 samples / 64 per step × 4 epochs) the weights have moved by ~1e-2 (at least 1e-3),
# and the two runs agree to float32 rounding (differences of ~1e-8, far below the change): accumulating
# `loss / 4` over 4 micro-batches gives the gradient of the mean loss over the 64 samples.

# %%
assert moved > 1e-3
assert diff < 1e-5
assert abs(results[64][1]["train/actor/policy_loss"] - results[16][1]["train/actor/policy_loss"]) < 1e-5

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
# clip_high, clip_c)` returning the mean loss over the samples (all inputs [N]). Replace the body; the cases mix
# ratios inside and outside the clip range, with positive and negative advantages.

# %%
def reference_ppo_loss(logprobs, old_logprobs, advantages, clip_low, clip_high, clip_c):
    mask = torch.ones_like(advantages)
    return compute_ppo_actor_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, clip_c)[0]


def my_ppo_loss(logprobs, old_logprobs, advantages, clip_low, clip_high, clip_c):
    # EXERCISE: replace the line below with the formulas at the top of this tutorial.
    return reference_ppo_loss(logprobs, old_logprobs, advantages, clip_low, clip_high, clip_c)


def case(seed: int, n: int, clip_low: float, clip_high: float, clip_c: float):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 2, torch.randn(n, generator=g), torch.randn(n, generator=g),
            clip_low, clip_high, clip_c)


CASES = [case(0, 64, 0.2, 0.2, 3.0), case(1, 128, 0.2, 0.28, 3.0), case(2, 32, 0.1, 0.3, 1.5)]
check_exercise(my_ppo_loss, reference_ppo_loss, CASES)


def without_dual_clip(logprobs, old_logprobs, advantages, clip_low, clip_high, clip_c):
    return reference_ppo_loss(logprobs, old_logprobs, advantages, clip_low, clip_high, float("inf"))


assert not matches(without_dual_clip, reference_ppo_loss, CASES)  # a wrong answer fails
