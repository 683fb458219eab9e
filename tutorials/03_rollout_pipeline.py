# %% [markdown]
# # 03 — The rollout pipeline: env and policy take turns over two queues, overlapped
#
# Run it: `python tutorials/03_rollout_pipeline.py` (about 16 s on a 2-core CPU: it starts the worker processes
# twice). Every stated fact is an `assert` in the cell after it. Terms (chunk step, env step, stage,
# bootstrap, truncation, ...): [the glossary](glossary.md).
#
# ## What this stage does, and why RLinf has it
#
# `generate_rollouts` collects the step's trajectories. The **env** workers own the simulators, the **rollout**
# workers own the policy copy that infers actions; they talk over two keyed queues (RLinf: two `Channel`s):
#
#     rollout channel:  env  --{obs, env_ids, sample_step}-->  rollout      key (mode, env rank, stage)
#     env channel:      env <--{actions, logprobs, values, version}--  rollout
#
# **Action chunks.** A VLA predicts `actor.model.num_action_chunks` (C) actions per inference, and the env executes
# them open loop, one after the other, before it sends the next observation. So the unit of time of a rollout is the
# **chunk step** (one inference, then C **env steps**). `env.train.max_steps_per_rollout_epoch` counts env steps; a
# rollout epoch has T = max_steps_per_rollout_epoch / C chunk steps, and a trajectory has one row per chunk step:
# actions [T, B, C, A], one reward per chunk step (the C rewards summed) and one done (whether one of the C env
# steps ended the episode, by termination — the goal reached — or by truncation — the time limit
# `max_episode_steps`). With C = 1 env steps and chunk steps are the same thing; here C = 2, so they differ.
#
# **Pipelining.** Left alone, env and policy wait for each other: the simulator idles while the policy infers, and
# the other way round. RLinf's answer is **fine-grained pipelining**: each env rank splits its envs into
# `rollout.pipeline_stage_num` (S) groups, each a separate vector env. The env sends the first observations of
# all stages; then, while it steps stage k, the rollout already infers the actions of stage k+1. With S = 2 and
# equal env and inference times, each hides the other. At the end the env cuts its trajectories into one piece
# per actor share and puts them on a third channel, to the actor.
#
# ## The code to read
#
# - `stages/rollout.py`: the module docstring (the protocol), `EnvWorker._make_stage_envs` (which env ids go to
#   which stage), `EnvWorker._run_epoch` (prime every stage, then per chunk step and stage: get actions → step →
#   put obs), `RolloutWorker._serve` (per chunk step and stage: get obs → infer → put actions),
#   `EnvWorker.interact` (stack the stages, cut the pieces for the actor), `_stack_trajectory` (one reward and one
#   done per chunk step).
# - `rlinf_mini/envs/base.py::chunk_step`: C env steps per call, open loop; rewards and flags [B, C].
# - `rlinf_mini/runners/embodied.py::EmbodiedRunner.generate_rollouts`: starts `env.interact`, `rollout.generate` and
#   `actor.recv_rollout_trajectories` together and waits for all three.
# - `rlinf_mini/utils/seeding.py::counter_uniform`: the action noise is a hash of (seed, env id, sample step), which is
#   why the way envs are split into stages cannot change a trajectory.

# %%
import time

import torch
from workbench import OUT, ROOT

from rlinf_mini.config import load_config
from rlinf_mini.scheduler import tracer
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.train import RunPlan, launch
from stages.placement import HybridComponentPlacement
from stages.rollout import TRAJECTORY_KEYS

MLP = str(ROOT / "configs/embodied_mlp.yaml")

# %% [markdown]
# ## Run it (1): the same rollout with 1 and with 2 pipeline stages, in chunks of 2 actions
#
# The MLP config (hybrid placement: env on device 0, rollout on device 1, one actor rank on device 0), shrunk to
# 16 envs × 16 env steps, with `num_action_chunks` 2 (so T = 8 chunk steps) and `max_episode_steps` 6 (so episodes
# also end by truncation), started twice: once with `pipeline_stage_num` 1, once with 2. Each time we make the
# runner's own calls — sync the weights, `generate_rollouts` — and fetch the trajectories the actor received.
#
# The MLP and the fake env are so small that their calls cost about as much as the messages between them: too little
# work to see overlap. So both runs also set the two latency knobs, which stand for the work of a real setup:
# `env.train.step_latency_s` (a simulator: the env process waits this long per env step) and `rollout.policy_latency_s`
# (a policy on a GPU or a server: the rollout process waits this long per inference). Both are sleeps: work done
# elsewhere while the worker process waits, RLinf's setting; that also keeps the figures steady on a CPU shared with
# other jobs. A chunk step of all 16 envs costs E = 50 ms of env time, an inference over all of them P = 50 ms, so one
# stage's call (1/S of the envs) waits E / S and P / S. Each runner then makes two more `generate_rollouts` calls,
# timed; the best counts (a busy machine only adds time). Every worker records its spans with the tracer
# (`rlinf_mini/scheduler/tracer.py`), which draws the timelines. The second runner also runs one whole training step,
# for the RLinf#485 section below.

# %%
E = P = 0.05
C, T = 2, 8  # actions per chunk, chunk steps per rollout epoch
ENV_STEPS = C * T


def config(stage_num: int):
    return load_config(["--config", MLP, "--runner.no-progress-bar", "--rollout.pipeline-stage-num", str(stage_num),
                        "--cluster.component-placement.actor", "0", "--actor.model.num-action-chunks", str(C),
                        "--env.train.total-num-envs", "16", "--env.train.max-steps-per-rollout-epoch", str(ENV_STEPS),
                        "--env.train.max-episode-steps", "6", "--actor.global-batch-size", "64",
                        "--actor.micro-batch-size", "32", "--env.train.step-latency-s", str(E / stage_num / C),
                        "--rollout.policy-latency-s", str(P / stage_num),
                        "--runner.logger.log-path", str(OUT / "runs"), "--runner.logger.experiment-name", "03_step"])


ROLLOUT_WEIGHTS = {}


def one_rollout(stage_num: int, then_train: bool = False):
    cfg = config(stage_num)
    plan = RunPlan(cfg, f"03 stage_num {stage_num}")
    cluster = Cluster(cfg.cluster)
    try:
        runner = launch(cfg, plan, cluster)
        runner.init_workers()  # runner.trace is on by default: every worker records spans
        runner.update_rollout_weights()
        ROLLOUT_WEIGHTS[stage_num] = runner.rollout.get_state_dict().wait()[0]  # version 0, for the replay below
        runner.actor.set_global_step(0).wait()
        metrics = runner.generate_rollouts()
        batches = runner.actor.get_rollout_batch().wait()  # one dict per actor rank
        best, spans = float("inf"), []
        for _ in range(2):
            for group in (runner.env, runner.rollout):
                group.trace_drain().wait()
            start = time.perf_counter()
            runner.generate_rollouts()
            took = time.perf_counter() - start
            if took < best:
                best = took
                spans = [s for g in (runner.env, runner.rollout) for per_rank in g.trace_drain().wait()
                         for s in per_rank]
        if then_train:  # one whole training step, traced the way `runner.run()` traces each step
            for group in (runner.env, runner.rollout, runner.actor):
                group.trace_drain().wait()
            tracer.drain()
            runner.train_step()
            runner.gather_trace()
            plan.run_dir.mkdir(parents=True, exist_ok=True)
            runner.write_trace()  # trace.json and timeline.png into the run folder
    finally:
        cluster.shutdown()
    return cfg, batches, metrics, best, spans, runner


cfg1, unpipelined, m1, t1, spans1, _ = one_rollout(1)
cfg2, pipelined, m2, t2, spans2, runner2 = one_rollout(2, then_train=True)
for name in TRAJECTORY_KEYS:
    print(f"{name:9} {list(pipelined[0][name].shape)}")
print(f"samples served by the rollout: {m1['rollout/samples']:.0f} (S=1), {m2['rollout/samples']:.0f} (S=2)")

# %% [markdown]
# ## What you should see (1)
#
# The actor rank holds all 16 envs: obs [8, 16, 4] (T chunk steps × envs × obs dim), actions [8, 16, 2, 2]
# (T × envs × C × action dim), values [9, 16] (one more: the **bootstrap** value, inferred after the last chunk
# step, which GAE needs to value what comes after it), rewards, dones, logprobs, versions [8, 16]. The pipelined
# and unpipelined rollouts produce **identical trajectories, bitwise** (`torch.equal` on every tensor): stages
# change when things happen, never what happens. The rollout served 16 × (8 + 1) = 144 samples (one per env per
# chunk step, +1 for the bootstrap) either way: one inference for every C = 2 env steps.

# %%
assert len(pipelined) == len(unpipelined) == 1
traj = pipelined[0]
assert traj["obs"].shape == (T, 16, 4) and traj["actions"].shape == (T, 16, C, 2)
assert traj["values"].shape == (T + 1, 16) and all(traj[k].shape == (T, 16) for k in ("rewards", "dones", "versions"))
for name in TRAJECTORY_KEYS:
    assert torch.equal(pipelined[0][name], unpipelined[0][name]), name
assert m1["rollout/samples"] == m2["rollout/samples"] == 16 * (T + 1) == 16 * (ENV_STEPS // C + 1)
assert traj["rewards"].abs().sum() > 0  # a real rollout: the policy moved, rewards were earned

# %% [markdown]
# Now replay the actor's trajectory by hand: the same 16 envs, built in this process, reset, and stepped with the
# recorded actions, one chunk at a time. Each `chunk_step` executes C = 2 env steps and returns a reward and the
# termination and truncation flags per env step ([16, 2]); the trajectory's reward of a chunk step is the sum of
# its two, its done is "either env step ended the episode", and the time limit did truncate episodes in this run
# (with `auto_reset`, the default, a sub-env whose episode ended starts the next one at once). 8 chunk steps made 16
# env steps per env.
#
# A truncated episode did not end in a terminal state: the time limit cut it. Its last reward therefore also holds
# gamma × V(final observation) (`algorithm.bootstrap_type: standard`, RLinf's default): the env keeps the observation
# it saw before the auto-reset (`env.final_obs`), sends it with the next observations, and the rollout infers its
# value. Here the replay asks the env for those observations and values them with the rollout's weights of version
# 0, the ones that produced the trajectory.

# %%
from rlinf_mini.envs import make_env
from rlinf_mini.models import build_policy

env = make_env(cfg2.env.train, torch.arange(16), C)
env.final_obs_of = "truncations"  # what the env worker sets for bootstrap_type standard
policy = build_policy(cfg2.actor.model, env.spec.obs_dim, env.spec.action_dim, env.spec.discrete)
policy.load_state_dict(ROLLOUT_WEIGHTS[2])
assert torch.equal(env.reset(), traj["obs"][0])
env_steps, truncated = 0, 0
for t in range(T):
    _, rewards, terminations, truncations, _ = env.chunk_step(traj["actions"][t])
    assert rewards.shape == terminations.shape == truncations.shape == (16, C)
    want = rewards.sum(dim=1)
    if env.final_obs is not None:  # (ended [16], observations whose ended rows are the final ones)
        ended, final_obs = env.final_obs
        with torch.no_grad():
            values = policy.predict_values(final_obs)
        want = want + torch.where(ended, cfg2.algorithm.gamma * values, 0.0)
    torch.testing.assert_close(traj["rewards"][t], want, rtol=0, atol=1e-6)
    assert torch.equal(traj["dones"][t], (terminations | truncations).any(dim=1))
    env_steps += rewards.shape[1]
    truncated += int(truncations.sum())
env.close()
print(f"{T} chunk steps = {env_steps} env steps per env; {truncated} truncations")
assert env_steps == ENV_STEPS == cfg2.env.train.max_steps_per_rollout_epoch and truncated > 0
assert cfg2.env.train.auto_reset

# %% [markdown]
# ### The default model: one inference of the tiny VLA
#
# `configs/embodied.yaml`'s model is the tiny VLA (`rlinf_mini/models/tiny_vla.py`) with `num_action_chunks` 2, on
# the PixelReach env (a 20×20 camera image, an instruction, the agent's position). Here a freshly initialised copy of
# it (what the train entry writes to `actor.model.model_path` on a first run) makes one inference for 4 envs, as a
# rollout rank does: `prepare_inputs` (tokenize the instructions) → `predict_action_batch`. Its actions are
# envs × chunks × action dim = [4, 2, 2], each action one of the 3 bin centres −1, 0, 1; one log-prob and one value
# per env (the log-prob is of the whole chunk); and the env executes the chunk as 2 env steps.

# %%
import dataclasses

from rlinf_mini.envs import get_env_spec
from rlinf_mini.models import build_policy
from rlinf_mini.utils.seeding import counter_uniform

vla_cfg = load_config(["--config", str(ROOT / "configs/embodied.yaml")])
model_cfg = dataclasses.replace(vla_cfg.actor.model, model_path="")  # a fresh model: nothing is read from disk
spec = get_env_spec(vla_cfg.env.train)
vla = build_policy(model_cfg, spec.obs_dim, spec.action_dim, spec.discrete, spec.image_shape).eval()
pixel_env = make_env(dataclasses.replace(vla_cfg.env.train, total_num_envs=4), torch.arange(4),
                     model_cfg.num_action_chunks)
obs = pixel_env.reset()
with torch.no_grad():
    noise = counter_uniform(vla_cfg.actor.seed, pixel_env.env_ids, 0, vla.noise_width)  # as the rollout samples
    out = vla.predict_action_batch(vla.prepare_inputs(obs), noise, mode="train")
_, vla_rewards, *_ = pixel_env.chunk_step(out["actions"])
pixel_env.close()
print(f"images {list(obs['images'].shape)}, instruction {obs['task_descriptions'][0]!r} -> actions "
      f"{list(out['actions'].shape)}, logprobs {list(out['logprobs'].shape)}, values {list(out['values'].shape)}")
assert model_cfg.model_type == "tiny_vla" and model_cfg.num_action_chunks == 2
assert out["actions"].shape == (4, 2, 2) == (4, model_cfg.num_action_chunks, spec.action_dim)
assert set(out["actions"].unique().tolist()) <= {-1.0, 0.0, 1.0}
assert out["logprobs"].shape == out["values"].shape == (4,) and vla_rewards.shape == (4, 2)

# %% [markdown]
# ## Run it (2): how much time did two stages save?

# %%
seconds, spans_of = {1: t1, 2: t2}, {1: spans1, 2: spans2}
ratio = seconds[2] / seconds[1]
ideal = (E + P) / max(E, P)
print(f"S=1: {seconds[1]:.3f} s, S=2: {seconds[2]:.3f} s for {T} chunk steps; S=2 / S=1 = {ratio:.2f} "
      f"(ideal 1 / {ideal:g} = {1 / ideal:.2f})")
pictures = {S: tracer.write_timeline_png(spans_of[S], OUT / f"03_timeline_stage{S}.png",
                                         title=f"pipeline_stage_num={S}, env chunk step E = inference P = "
                                               f"{E * 1e3:g} ms")
            for S in (1, 2)}
print("\n".join(str(p) for p in pictures.values()))

# %% [markdown]
# ## What you should see (2)
#
# With one stage a chunk step costs E + P: the env steps, then waits while the policy infers. With S stages, once
# the pipeline is full, the env steps stage k while the policy infers stage k+1, so a chunk step costs max(E, P)
# plus a little fill and drain. The ideal speedup is therefore **(E + P) / max(E, P)** — 2 when E = P, i.e. half
# the time; 1 (nothing to gain) when one side dominates. A finite rollout also has to fill the pipeline (the first
# stage's inference, before the env has anything to step) and drain it (the bootstrap inference of the last stage),
# and each message costs a little (pickling, a few system calls), so **two stages cut the time by about a half**:
# the unpipelined run pays 9 inferences and 8 env chunk steps, (9 + 8) · 50 ms = 0.85 s; the pipelined one about
# 25 + 8 · 50 + 25 ms = 0.45 s, a ratio of about 0.53 on a quiet machine (printed above, not asserted: a busy
# machine stretches any wall time).
# The fill and drain are paid once per rollout, so longer rollouts get closer to 0.5.
#
# The pictures: `03_timeline_stage1.png` shows the env row (blue `env_step`) and the rollout row (orange `inference`)
# taking strict turns, each waiting (thin grey bars) while the other works. `03_timeline_stage2.png` shows them
# working at the same time, on alternating stages (a later stage is a lighter shade). The env's waits for actions
# are what a run logs each step as the pipeline **bubble**, `time/trace/bubble/env_waits` (a fraction of
# `generate_rollouts`): two stages shrink it.

# %%
from matplotlib import colors as mcolors

assert ideal == 2.0
assert seconds[1] >= T * (E + P)  # one stage cannot beat doing the work in turn
colours = tracer.span_colours(["env_step", "inference"])
assert colours == {"env_step": mcolors.to_rgba("tab:blue"), "inference": mcolors.to_rgba("tab:orange")}


def overlap(spans) -> float:
    """Seconds in which the env and the rollout were working at the same time. A span is a tuple
    (component, rank, name, stage, start_ns, end_ns); one process's spans of one name never overlap each other."""
    env = [(s[4], s[5]) for s in spans if s[0] == "EnvGroup" and s[2] == "env_step"]
    inf = [(s[4], s[5]) for s in spans if s[0] == "RolloutGroup" and s[2] == "inference"]
    return sum(max(0, min(a1, b1) - max(a0, b0)) for a0, a1 in env for b0, b1 in inf) / 1e9


def turns(spans) -> str:
    """The order in which env chunk steps (E) and inferences (I) started: strict turns read IEIE...I."""
    work = sorted((s[4], s[2]) for s in spans if s[2] in ("env_step", "inference"))
    return "".join("E" if name == "env_step" else "I" for _, name in work)


def intersecting(spans) -> int:
    """How many (env chunk step, inference) pairs ran at the same time: one started before the other ended."""
    env = [(s[4], s[5]) for s in spans if s[0] == "EnvGroup" and s[2] == "env_step"]
    inf = [(s[4], s[5]) for s in spans if s[0] == "RolloutGroup" and s[2] == "inference"]
    return sum(a0 < b1 and b0 < a1 for a0, a1 in env for b0, b1 in inf)


print(f"env and policy working at the same time: {overlap(spans_of[1]):.3f} s (S=1), "
      f"{overlap(spans_of[2]):.3f} s (S=2)")
# By the order of events, which load cannot change: with one stage an inference needs the env's observation and an
# env step the policy's action, so their starts alternate; with two, the env steps one stage while the policy
# infers the other.
assert turns(spans_of[1]) == "I" + "EI" * T, turns(spans_of[1])
assert intersecting(spans_of[2]) >= 1
for p in pictures.values():
    assert p.read_bytes()[:4] == b"\x89PNG"


def env_bubble(spans) -> float:
    t0, t1 = min(s[4] for s in spans), max(s[5] for s in spans)
    return tracer.step_metrics(spans, t0, t1, window=(t0, t1))["time/trace/bubble/env_waits"]


print(f"time/trace/bubble/env_waits: {env_bubble(spans_of[1]):.2f} (S=1), {env_bubble(spans_of[2]):.2f} (S=2)")
assert 0.0 <= env_bubble(spans_of[2]) <= 1.0 and 0.0 <= env_bubble(spans_of[1]) <= 1.0  # fractions of the rollout

# %% [markdown]
# ## What the pipeline overlaps, and why the actor waits (RLinf#485)
#
# A user asked RLinf (issue #485) whether `pipeline_stage_num` overlaps the rollout with the actor. Here is a real
# training step of the S = 2 runner above (`runner.train_step()`, traced as `runner.run()` traces every step), with
# the actor's row: the runner wrote it to `runs/03_step/timeline.png` (and `trace.json`, which opens in
# https://ui.perfetto.dev), the step number in its title.
#
# - The pipeline overlaps **the simulator with the policy's inference**, inside `generate_rollouts`, and nothing
#   else: while the env steps one stage's envs, the rollout infers the next stage's actions.
# - It does **not** overlap rollout with training. The actor's update needs the whole step's trajectories (GAE runs
#   backwards from the bootstrap value; the global batches are shuffled over all of them), and the next step's
#   rollout needs the weights this update produces (stage 2's sync). So during `generate_rollouts` the actor sits in
#   `recv_rollout_trajectories`, waiting on the actor channel: it is busy less than a tenth of that phase, while the
#   env and the rollout are each busy more than half of it; during `actor_training` the env and the rollout do
#   nothing at all. (In the hybrid placement the actor shares device 0 with the env, and gets it to itself then.)
#
# That was also the maintainers' answer in #485: the env and the rollout are pipelined, the actor waits for the
# collected trajectories, though splitting training into micro batches could pipeline it too. RLinf later did that,
# for on-policy PPO and GRPO, without an asynchronous algorithm: PR #1195 (`use_training_pipeline`) sends trajectories
# to the actor in micro-batch-sized pieces as soon as a rollout epoch finishes, so that the actor trains on them
# while the env and the rollout collect the next rollout epoch (the weights stay those of the step's sync, so the data
# stay on-policy), and PR #1246 made advantage normalization work when the actor only holds part of the global batch.
# rlinf_mini keeps the simple, sequential step shown here.

# %%
spans = runner2.trace_spans
phase = {s[2]: (s[4], s[5]) for s in spans if s[0] == "driver"}


def busy(component: str, window: tuple[int, int]) -> float:
    """Fraction of `window` a component's ranks spent working (their mean), from the spans, not from the picture."""
    ranks = {s[1] for s in spans if s[0] == component}
    own = [[s for s in spans if s[0] == component and s[1] == r] for r in ranks]
    return sum(tracer.busy_ns(o, *window) for o in own) / len(own) / (window[1] - window[0])


during_rollout = {c: busy(c, phase["generate_rollouts"]) for c in ("ActorGroup", "EnvGroup", "RolloutGroup")}
during_training = {c: busy(c, phase["actor_training"]) for c in ("ActorGroup", "EnvGroup", "RolloutGroup")}
print("busy during generate_rollouts:", {c: f"{v:.0%}" for c, v in during_rollout.items()})
print("busy during actor_training:   ", {c: f"{v:.0%}" for c, v in during_training.items()})
step_picture = runner2.run_dir / "timeline.png"
print(step_picture)
assert {"ActorGroup", "EnvGroup", "RolloutGroup"} <= {s[0] for s in spans}  # the actor has its row
assert during_rollout["ActorGroup"] < 0.1
assert during_rollout["EnvGroup"] > 0.5 and during_rollout["RolloutGroup"] > 0.5
assert during_training["EnvGroup"] == during_training["RolloutGroup"] == 0 < during_training["ActorGroup"]
assert step_picture.read_bytes()[:4] == b"\x89PNG" and (runner2.run_dir / "trace.json").is_file()
assert runner2.last_traced_step == 1  # the title says "training step 1"
placement = HybridComponentPlacement(cfg2.cluster.component_placement, num_devices=cfg2.cluster.num_devices)
assert placement.get_hardware_ranks("actor") == placement.get_hardware_ranks("env") == [0]

# %% [markdown]
# ## The RLinf counterpart
#
# - `rlinf/workers/env/env_worker.py::EnvWorker`: `interact`, `_run_interact_once`, `evaluate`; the env list split
#   into `pipeline_stage_num` stages (`stage_num`), sends observations with `send`/`put` keyed by stage.
# - `rlinf/workers/rollout/hf/huggingface_worker.py::MultiStepRolloutWorker`: `generate` (per chunk step and stage:
#   receive obs → `predict_action_batch` → send actions), `sync_model_from_actor`.
# - `rlinf/runners/embodied_runner.py::EmbodiedRunner.generate_rollouts`: starts env, rollout and the actor's
#   receive together over the `Env`, `Rollout` and `Actor` channels (`rlinf/scheduler/channel/channel.py`).
# - `rlinf/data/schema/embodied_types.py`: `EnvOutput`, `ChunkStepResult`, `Trajectory` (here plain dicts).
# - Left out here: `send_to`/`recv_from` routing by `CommMapper` (the keys do that job), offloading between
#   phases, reward models.
#
# ## Exercise
#
# Which global env ids does each pipeline stage of each env rank own? Write `my_stage_env_ids(rank, world_size,
# stage_num, total_num_envs)` returning a list with one list of ids per stage (stage 0 first). The reference builds
# a real `EnvWorker` in this process and reads the ids of the vector envs `_make_stage_envs` built. (Hint: the ids
# are contiguous, rank-major, then stage.)

# %%
import dataclasses

from workbench import ROOT, check_exercise, matches

from rlinf_mini.config import load_config
from stages.rollout import EnvWorker

base_cfg = load_config(["--config", str(ROOT / "configs/embodied_mlp.yaml")])


def reference_stage_env_ids(rank: int, world_size: int, stage_num: int, total_num_envs: int) -> list[list[int]]:
    cfg = dataclasses.replace(base_cfg, rollout=dataclasses.replace(base_cfg.rollout, pipeline_stage_num=stage_num))
    worker = EnvWorker.__new__(EnvWorker)  # the runtime normally sets these before __init__
    worker._rank, worker._world_size, worker._group_name, worker.device = rank, world_size, "EnvGroup", "cpu"
    worker.__init__(cfg)
    split = dataclasses.replace(cfg.env.train, total_num_envs=total_num_envs)
    envs = worker._make_stage_envs(split, "env.train")
    ids = [env.env_ids.tolist() for env in envs]
    for env in envs:
        env.close()
    return ids


def my_stage_env_ids(rank: int, world_size: int, stage_num: int, total_num_envs: int) -> list[list[int]]:
    # EXERCISE: replace the line below with your own arithmetic.
    return reference_stage_env_ids(rank, world_size, stage_num, total_num_envs)


CASES = {"one rank, 2 stages": (0, 1, 2, 16), "rank 1 of 2, 2 stages": (1, 2, 2, 16),
         "rank 0 of 2, 4 stages": (0, 2, 4, 32), "rank 2 of 4, 2 stages": (2, 4, 2, 64),
         "rank 1 of 2, 1 stage": (1, 2, 1, 8)}
check_exercise(my_stage_env_ids, reference_stage_env_ids, CASES)


def stage_major(rank, world_size, stage_num, total_num_envs):  # stage first, then rank: a plausible wrong answer
    n = total_num_envs // world_size // stage_num
    return [list(range((k * world_size + rank) * n, (k * world_size + rank + 1) * n)) for k in range(stage_num)]


assert not matches(stage_major, reference_stage_env_ids, CASES)  # a wrong answer fails
