# %% [markdown]
# # 03 — The rollout pipeline: env and policy take turns over two queues, overlapped
#
# Run it: `python tutorials/03_rollout_pipeline.py` (20–45 s on a 2-core CPU, most of it starting worker
# processes twice). Every stated fact is an `assert` in the cell after it.
#
# ## What this stage does, and why RLinf has it
#
# `generate_rollouts` collects the step's trajectories. The **env** workers own the simulators, the **rollout**
# workers own the policy copy that infers actions; they talk over two keyed queues (RLinf: two `Channel`s):
#
#     rollout channel:  env  --{obs, env_ids, sample_step}-->  rollout      key (mode, env rank, stage)
#     env channel:      env <--{actions, logprobs, values, version}--  rollout
#
# Left alone, env and policy wait for each other: the simulator idles while the policy infers, and the other way
# round. RLinf's answer is **fine-grained pipelining**: each env rank splits its envs into
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
#   `EnvWorker.interact` (stack the stages, cut the pieces for the actor).
# - `rlinf_mini/runner.py::EmbodiedRunner.generate_rollouts`: starts `env.interact`, `rollout.generate` and
#   `actor.recv_rollout_trajectories` together and waits for all three.
# - `rlinf_mini/utils/seeding.py::counter_uniform`: the action noise is a hash of (seed, env id, sample step), which is
#   why the way envs are split into stages cannot change a trajectory.

# %%
import dataclasses
import time

import torch
from workbench import OUT, ROOT, check_exercise, matches

from rlinf_mini.config import load_config
from rlinf_mini.scheduler import tracer
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.train import RunPlan, launch
from stages.rollout import TRAJECTORY_KEYS, EnvWorker

MLP = str(ROOT / "configs/embodied_mlp.yaml")

# %% [markdown]
# ## Run it (1): the same rollout with 1 and with 2 pipeline stages
#
# The MLP config (hybrid placement: env on device 0, rollout on device 1, actor on both), shrunk to 16 envs × 8
# chunk steps, started twice: once with `pipeline_stage_num` 1, once with 2. Each time we make the runner's own
# calls — sync the weights, `generate_rollouts` — and fetch the trajectories each actor rank received.
#
# The MLP and the fake env take ~0.1 ms a call: too little to see overlap (a message costs about as much). So both
# runs also set the two latency knobs, which stand for the work of a real setup: `env.train.step_latency_s` (a
# simulator: the env process waits this long per step) and `rollout.policy_latency_s` (a policy on a GPU or a server:
# the rollout process waits this long per inference). Both are sleeps: work done elsewhere while the worker process
# waits, RLinf's setting; that also keeps the figures steady on a CPU shared with other jobs. A step of all 16 envs
# costs E = 50 ms, an inference over all of them P = 50 ms, so one stage's call (1/S of the envs) waits E / S and
# P / S. Each runner then makes two more `generate_rollouts` calls, timed; the best counts (a busy machine only adds
# time). Every worker records its spans with the tracer (`rlinf_mini/scheduler/tracer.py`), which draws the
# timelines.

# %%
E = P = 0.05
N_STEPS = 8


def one_rollout(stage_num: int) -> tuple[list[dict], dict, float, list]:
    cfg = load_config(["--config", MLP, "--runner.no-progress-bar", "--rollout.pipeline-stage-num", str(stage_num),
                       "--env.train.total-num-envs", "16", "--env.train.max-steps-per-rollout-epoch", str(N_STEPS),
                       "--actor.global-batch-size", "64", "--actor.micro-batch-size", "32",
                       "--env.train.step-latency-s", str(E / stage_num),
                       "--rollout.policy-latency-s", str(P / stage_num)])
    plan = RunPlan(cfg, f"03 stage_num {stage_num}")
    cluster = Cluster(cfg.cluster)
    try:
        runner = launch(cfg, plan, cluster)
        runner.init_workers()  # runner.trace is on by default: every worker records spans
        runner.update_rollout_weights()
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
    finally:
        cluster.shutdown()
    return batches, metrics, best, spans


unpipelined, m1, t1, spans1 = one_rollout(1)
pipelined, m2, t2, spans2 = one_rollout(2)
for name in TRAJECTORY_KEYS:
    print(f"{name:9} {list(pipelined[0][name].shape)} per actor rank")
print(f"samples served by the rollout: {m1['rollout/samples']:.0f} (S=1), {m2['rollout/samples']:.0f} (S=2)")

# %% [markdown]
# ## What you should see (1)
#
# Each of the 2 actor ranks holds half of the 16 envs: obs [8, 8, 4] (T chunk steps × envs × obs dim), values
# [9, 8] (one more: the bootstrap value after the last step), rewards, dones, logprobs, versions [8, 8]. The
# pipelined and unpipelined rollouts produce **identical trajectories, bitwise** (`torch.equal` on every tensor
# of every actor rank): stages change when things happen, never what happens. The rollout served
# 16 × (8 + 1) = 144 samples (the +1 is the bootstrap inference) either way.

# %%
assert len(pipelined) == len(unpipelined) == 2
assert pipelined[0]["obs"].shape == (8, 8, 4) and pipelined[0]["values"].shape == (9, 8)
for rank in range(2):
    for name in TRAJECTORY_KEYS:
        assert torch.equal(pipelined[rank][name], unpipelined[rank][name]), (rank, name)
assert m1["rollout/samples"] == m2["rollout/samples"] == 16 * (8 + 1)
assert pipelined[0]["rewards"].abs().sum() > 0  # a real rollout: the policy moved, rewards were earned

# %% [markdown]
# ## Run it (2): how much time did two stages save?

# %%
seconds, spans_of = {1: t1, 2: t2}, {1: spans1, 2: spans2}
ratio = seconds[2] / seconds[1]
ideal = (E + P) / max(E, P)
print(f"S=1: {seconds[1]:.3f} s, S=2: {seconds[2]:.3f} s for {N_STEPS} steps; S=2 / S=1 = {ratio:.2f} "
      f"(ideal 1 / {ideal:g} = {1 / ideal:.2f})")
pictures = {S: tracer.write_timeline_png(spans_of[S], OUT / f"03_timeline_stage{S}.png",
                                         title=f"pipeline_stage_num={S}, env step E = inference P = {E * 1e3:g} ms")
            for S in (1, 2)}
print("\n".join(str(p) for p in pictures.values()))

# %% [markdown]
# ## What you should see (2)
#
# With one stage a step costs E + P: the env steps, then waits while the policy infers. With S stages, once the
# pipeline is full, the env steps stage k while the policy infers stage k+1, so a step costs max(E, P) plus a
# little fill and drain. The ideal speedup is therefore **(E + P) / max(E, P)** — 2 when E = P, i.e. half the
# time; 1 (nothing to gain) when one side dominates. A finite rollout also has to fill the pipeline (the first
# stage's inference, before the env has anything to step) and drain it (the bootstrap inference of the last
# stage), and each message costs tens of µs more (pickling, a few system calls), so **two stages cut the time by
# about a half**: over these 8 steps, S=2 / S=1 ≈ 0.55 on a 2-core CPU (the unpipelined run pays 9 inferences and
# 8 env steps, (9 + 8) · 50 ms; the pipelined one about 25 + 8 · 50 + 25 ms: 0.53; the assert allows up to 0.8,
# for a machine busy with other work). Longer rollouts get closer to 0.5.
#
# The pictures: `03_timeline_stage1.png` shows the env row (blue `env_step`) and the rollout row (orange `inference`)
# taking strict turns, each waiting (thin grey bars) while the other works. `03_timeline_stage2.png` shows them
# working at the same time, on alternating stages (a later stage is a lighter shade).

# %%
assert ideal == 2.0
assert ratio <= 0.8, f"two stages should cut the time clearly: S=2 / S=1 = {ratio:.2f}"
assert seconds[1] >= N_STEPS * (E + P)  # one stage cannot beat doing the work in turn


def overlap(spans) -> float:
    """Seconds in which the env and the rollout were working at the same time. A span is a tuple
    (component, rank, name, stage, start_ns, end_ns); one process's spans of one name never overlap each other."""
    env = [(s[4], s[5]) for s in spans if s[0] == "EnvGroup" and s[2] == "env_step"]
    inf = [(s[4], s[5]) for s in spans if s[0] == "RolloutGroup" and s[2] == "inference"]
    return sum(max(0, min(a1, b1) - max(a0, b0)) for a0, a1 in env for b0, b1 in inf) / 1e9


print(f"env and policy working at the same time: {overlap(spans_of[1]):.3f} s (S=1), "
      f"{overlap(spans_of[2]):.3f} s (S=2)")
assert overlap(spans_of[1]) < 0.1 * N_STEPS * E  # strict turns
assert overlap(spans_of[2]) > 0.3 * N_STEPS * E  # overlapped
for p in pictures.values():
    assert p.read_bytes()[:4] == b"\x89PNG"

# %% [markdown]
# ## What the pipeline overlaps, and why the actor waits (RLinf#485)
#
# A user asked RLinf (issue #485) what exactly its pipeline overlaps. The answer, visible in the timelines:
#
# - It overlaps **the simulator with the policy's inference**, inside `generate_rollouts`, and nothing else:
#   while the env steps one stage's envs, the rollout infers the next stage's actions. With S = 1 there is no
#   overlap at all — each side waits for the other.
# - It does **not** overlap rollout with training. PPO is on-policy: the actor's update needs the whole step's
#   trajectories (GAE runs backwards from the bootstrap value at T + 1; the global batches are shuffled over all of
#   them), and the next step's rollout needs the weights this update produces (stage 2's sync). So during
#   `generate_rollouts` the actor sits in `recv_rollout_trajectories`, waiting on the actor channel; in the hybrid
#   placement it shares devices with the env and the rollout anyway, and gets them to itself while they are idle.
#   Run a training step with `runner.trace: true` (the default) and open the run folder's `timeline.png` or
#   `trace.json`: the actor's rows are a wait during the rollout, and the env and rollout rows are idle during
#   `actor_training`. (Overlapping those needs an off-policy or asynchronous algorithm: RLinf's async runners.)
#
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
base_cfg = load_config(["--config", MLP])


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


CASES = [(0, 1, 2, 16), (1, 2, 2, 16), (0, 2, 4, 32), (2, 4, 2, 64), (1, 2, 1, 8)]
check_exercise(my_stage_env_ids, reference_stage_env_ids, CASES)


def stage_major(rank, world_size, stage_num, total_num_envs):  # stage first, then rank: a plausible wrong answer
    n = total_num_envs // world_size // stage_num
    return [list(range((k * world_size + rank) * n, (k * world_size + rank + 1) * n)) for k in range(stage_num)]


assert not matches(stage_major, reference_stage_env_ids, CASES)  # a wrong answer fails
