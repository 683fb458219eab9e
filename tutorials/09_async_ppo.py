# %% [markdown]
# # 09 — Asynchronous PPO: env and rollout run ahead while the actor trains
#
# Run it: `python tutorials/09_async_ppo.py` (five short training runs of the MLP config; its time on 2 cores is in
# README's tutorial table). Every stated fact is an `assert` in the cell after it; order is read from the runner's
# launch log, the versions the trajectories carry and the order of the trace's events, never from durations. Words in
# doubt: the [glossary](glossary.md). The long story: [docs/async_ppo.md](../docs/async_ppo.md).
#
# ## What this stage does, and why RLinf has it
#
# In the synchronous step (tutorial 06) the actor waits for the whole rollout, then env and rollout wait for the
# actor's update. Async PPO (`algorithm.loss_type: decoupled_actor_critic`) lets env and rollout produce batch i+1
# while the actor trains batch i. The price is stale data: a sample may come from weights a few versions older than
# the actor's. Two rules keep that in hand:
#
# - **the bound** (AReaL's): batch i may start only once i <= actor version + `algorithm.staleness_threshold`; it
#   starts by loading the newest published weights (at least version i - threshold: the rollout waits for that
#   stamp, as RLinf's rollout waits in `wait_if_stale`), and every sample is tagged with that version. The driver
#   queues each batch one version before it may start, so it starts the moment its version is published;
# - **the decoupled loss**: PPO's clip is taken against a *proximal* policy pi_prox (close to the current one), and
#   each sample is weighted by pi_prox / pi_behav (how far the policy that acted is from that anchor). The anchor is
#   recomputed by an actor forward (`rollout.recompute_logprobs: true`: one more forward per step) or interpolated
#   from the versions (false, RLinf's default: free, but only as good as a linear guess).
#
# ## The code to read
#
# - `rlinf_mini/runners/embodied_async.py`: `AsyncEmbodiedRunner` — `may_launch` (how far ahead batches are queued,
#   and a checkpoint as a barrier), `launch_rollouts` (group calls queued, not waited for), `train_step`.
# - `stages/train_async.py`: `AsyncActorWorker.construct_rollout_batch` (the store ordered by version),
#   `compute_proximal_logprobs`; `stages/train.py::compute_micro_batch_loss` calls the decoupled loss.
# - `stages/losses.py`: `interpolate_proximal_logprobs`, `compute_decoupled_ppo_actor_loss`.
# - `stages/weight_buffer.py::read_newest`: the rollout's torn-free read while the actor may be writing (on Ray,
#   `stages/sync.py::WeightReceiver.load_newest` takes the weight mailbox's messages first).

# %%
import shutil

import torch
from workbench import OUT, ROOT, check_exercise, matches

from rlinf_mini.config import load_config
from rlinf_mini.train import RunPlan, run_to_the_end
from stages.losses import interpolate_proximal_logprobs

MLP = str(ROOT / "configs/embodied_mlp.yaml")
RUNS = OUT / "runs"


def train(name: str, *extra: str):
    """A 4-step run of the MLP config, made tiny (16 envs x 8 steps), a checkpoint at step 4; returns the runner
    (its history, launch log and trace spans) after every process has stopped."""
    shutil.rmtree(RUNS / name, ignore_errors=True)  # a rerun starts fresh
    cfg = load_config(["--config", MLP, "--runner.max-epochs", "4", "--runner.val-check-interval", "-1",
                       "--runner.save-interval", "4", "--runner.no-progress-bar", "--runner.log-interval", "100",
                       "--runner.logger.log-path", str(RUNS), "--runner.logger.experiment-name", name,
                       "--runner.logger.logger-backends", "--env.train.total-num-envs", "16",
                       "--env.train.max-steps-per-rollout-epoch", "8", "--actor.global-batch-size", "64",
                       "--actor.micro-batch-size", "32", *extra])
    return run_to_the_end(cfg, RunPlan(cfg, name))


def asynchronous(staleness: int, *extra: str) -> tuple[str, ...]:
    return ("--algorithm.loss-type", "decoupled_actor_critic", "--algorithm.staleness-threshold", str(staleness),
            *extra)


# %% [markdown]
# ## Run it (1): the interpolated anchor, on numbers
#
# The actor holds version v = 4 and this update makes v_theta = 5; the anchor is the actor's weights now (v_prox = 4).
# Interpolated, its log-prob is `old + alpha (logp - old)` with alpha = (v_prox - v_behav) / (v_theta - v_behav):
# a sample of the actor's own version gets alpha 0 (its behaviour log-prob exactly), one a version behind 1/2, two
# behind 2/3.

# %%
old, logp = torch.zeros(3), torch.ones(3)
versions = torch.tensor([4, 3, 2])  # v_behav of three samples
prox = interpolate_proximal_logprobs(logp, old, versions, current_version=5)
print("alpha per sample:", prox.tolist())

# %% [markdown]
# ## What you should see (1)
#
# [0, 1/2, 2/3]: the staler the sample, the nearer its anchor is to the current policy.

# %%
assert torch.allclose(prox, torch.tensor([0.0, 1 / 2, 2 / 3]))

# %% [markdown]
# ## Run it (2): staleness 0 is the synchronous run
#
# With threshold 0, batch i waits for version i: the synchronous schedule. The anchor then is the behaviour policy
# (alpha 0), the weight 1, and the decoupled loss PPO's bit for bit.

# %%
sync = train("09_sync")
s0 = train("09_s0", *asynchronous(0))
weights = {name: torch.load(r.run_dir / "checkpoints/global_step_4/actor/actor.pt", weights_only=True)["model"]
           for name, r in (("sync", sync), ("s0", s0))}
print("policy loss, sync:", [round(h["train/actor/policy_loss"], 6) for h in sync.history])
print("policy loss, s0:  ", [round(h["train/actor/policy_loss"], 6) for h in s0.history])

# %% [markdown]
# ## What you should see (2)
#
# The same losses, the same returns, the same final weights, bit for bit.

# %%
assert all(torch.equal(weights["sync"][k], weights["s0"][k]) for k in weights["sync"])
for a, b in zip(sync.history, s0.history, strict=True):
    assert a["train/actor/policy_loss"] == b["train/actor/policy_loss"] and a["env/reward"] == b["env/reward"]

# %% [markdown]
# ## Run it (3): staleness 1 and 2 — the timeline
#
# With the tracer on, each worker records a span per call. The runner's launch log says, for each batch, the actor's
# version when the driver queued it. (The checkpoint at step 4 is the run's end here, so no barrier shows.)

# %%
s1 = train("09_s1", *asynchronous(1), "--runner.trace")
s2 = train("09_s2", *asynchronous(2), "--runner.trace")
print("s1 (batch, actor version when queued):", s1.launch_log)
print("s2 (batch, actor version when queued):", s2.launch_log)
generate = [s for s in s1.trace_spans if s[0] == "RolloutGroup" and s[2] == "generate"]
training = [s for s in s1.trace_spans if s[0] == "ActorGroup" and s[1] == 0 and s[2] == "run_training"]
overlaps = [(gi, ti) for gi, g in enumerate(generate) for ti, t in enumerate(training) if g[4] < t[5] and t[4] < g[5]]
print("rollout batch overlapping actor update (s1):", overlaps)

# %% [markdown]
# ## What you should see (3)
#
# With threshold 1, batches up to i+2 are queued at actor version i: batch i+1 runs before the actor trains batch i,
# and batch i+2 waits in the rollout's weight load until version i+1 is published (so it was made by version i+1
# or newer: the bound holds without the driver's help). With 2, one more. In the trace, the rollout's `generate` of
# a later batch starts before an actor update ends and ends after it starts: they ran at the same time (the
# timeline is `runs/09_s1/timeline.png`).

# %%
assert s1.launch_log == [(0, 0), (1, 0), (2, 0), (3, 1)]
assert s2.launch_log == [(0, 0), (1, 0), (2, 0), (3, 0)]
loaded = [h["rollout/weight_version"] for h in s1.history]
assert all(loaded[b] >= b - 1 for b, queued_at in s1.launch_log if b > queued_at + 1)  # queued early, made late
assert any(g > t for g, t in overlaps)  # a *later* batch than the one being trained

# %% [markdown]
# ## Run it (4): staleness 0 / 1 / 2 side by side, and what the anchors cost
#
# Per run: the share of samples one version behind the actor, the versions the rollout loaded, and
# `behav_approx_kl` (the k1 distance between the behaviour policy and the anchor: 0 when they coincide). A fifth run
# recomputes the anchor (`rollout.recompute_logprobs: true`): one more actor call per step, whose critic values
# (the proximal values) then replace the rollout's one-version-older ones in GAE.

# %%
s1r = train("09_s1_recompute", *asynchronous(1, "--rollout.recompute-logprobs"), "--runner.trace")
table = {}
for name, r in (("s0", s0), ("s1", s1), ("s2", s2), ("s1 recomputed", s1r)):
    table[name] = [(h["rollout/weight_version"], h.get("rollout/data_staleness_1/ratio", 0.0),
                    h.get("rollout/data_staleness_2/ratio", 0.0), h["train/actor/behav_approx_kl"])
                   for h in r.history]
    print(f"{name:14s}", [f"v{v:g} stale1 {a:.2f} stale2 {b:.2f} kl {k:+.1e}" for v, a, b, k in table[name]])
extra_forward = [s for s in s1r.trace_spans if s[0] == "ActorGroup" and s[2] == "compute_proximal_logprobs"]

# %% [markdown]
# ## What you should see (4)
#
# Staleness 0: every sample of the actor's own version, the anchor the behaviour policy (kl 0). With 1 (2), no sample
# is more than 1 (2) versions behind the actor, and the rollout's version at step i is at least i - 1 (i - 2). Where
# samples are stale, the interpolated anchor moves off the behaviour policy (kl != 0). The recomputed anchor cost one
# `compute_proximal_logprobs` call per step on each actor rank (4 steps x 2 ranks), which the interpolated one does
# not make. Which threshold learns faster per sample is not settled by 4 steps: docs/async_ppo.md says what is
# measured.

# %%
assert all(v == i and a == 0 and k == 0 for i, (v, a, _, k) in enumerate(table["s0"]))
for name, bound in (("s1", 1), ("s2", 2), ("s1 recomputed", 1)):
    for i, (v, _, b, _) in enumerate(table[name]):
        assert i - bound <= v <= i and (bound == 2 or b == 0)
assert any(k != 0 for _, a, _, k in table["s1"] if a > 0)
assert len(extra_forward) == 8
assert not [s for s in s1.trace_spans if s[2] == "compute_proximal_logprobs"]

# %% [markdown]
# ## The RLinf counterpart
#
# `rlinf/runners/async_ppo_embodied_runner.py::AsyncPPOEmbodiedRunner` runs env and rollout as long-lived services
# that stream trajectories to the actor (`rlinf/workers/actor/async_ppo_fsdp_worker.py`: a receiving thread, a
# `PriorityStore`), and the rollout blocks in `wait_if_stale`. Here the driver queues whole batches on workers that
# run their calls in order, and the rollout blocks in its weight load, which gives the same bound with no threads.
# RLinf's runner raises `NotImplementedError` for `rollout.recompute_logprobs: true`; here both anchors run.
#
# ## Exercise
#
# Write the interpolated anchor yourself: `old + alpha (logp - old)`, alpha = (v_theta - 1 - v_behav) / (v_theta -
# v_behav) clamped to [0, 1], and 0 where v_theta <= v_behav or the version is negative (not generated); detached.

# %%
reference = interpolate_proximal_logprobs


def my_proximal_logprobs(logprobs, old_logprobs, versions, current_version):
    # EXERCISE: compute alpha per sample, then the anchor (hint: torch.where, .clamp(0, 1)).
    return reference(logprobs, old_logprobs, versions, current_version)


CASES = {"own version, one and two behind": (torch.ones(3), torch.zeros(3), torch.tensor([4, 3, 2]), 5),
         "a sample newer than v_theta": (torch.randn(4), torch.randn(4), torch.tensor([0, 5, 6, 1]), 5),
         "not generated (version -1)": (torch.randn(2), torch.randn(2), torch.tensor([-1, 0]), 1),
         "far behind": (torch.randn(5), torch.randn(5), torch.tensor([0, 1, 2, 3, 9]), 10)}
check_exercise(my_proximal_logprobs, reference, CASES)
no_clamp = lambda lp, old, v, cur: old + (cur - 1 - v) / (cur - v) * (lp - old)  # noqa: E731
assert not matches(no_clamp, reference, CASES)  # a wrong answer (no clamp, no guard) fails
