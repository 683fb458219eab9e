# %% [markdown]
# # 06 — The full run: config → cluster → groups → runner, checkpoint, resume, eval, metrics, a worker's failure
#
# Run it: `python tutorials/06_full_run.py` (two short training runs, then two that fail on purpose; its time on
# 2 cores is in README's tutorial table, which the tests check). Every stated fact is an `assert` in the cell after
# it. Words in doubt: the [glossary](glossary.md).
#
# ## What this stage does, and why RLinf has it
#
# Tutorials 01–05 took one RL step apart. This one puts it back together the way `python -m rlinf_mini.train`
# does, and as RLinf's `examples/embodiment/train_embodied_agent.py` does:
#
#     cfg     = load_config(argv)             # YAML -> typed dataclasses -> command-line overrides (exit 2 if bad)
#     plan    = RunPlan(cfg, source)          # placement, world sizes, batch arithmetic: checked, no process yet
#     cluster = Cluster(cfg.cluster)          # devices: GPUs, or shares of the CPU cores
#     runner  = launch(cfg, plan, cluster)    # actor, rollout, env: XWorker.create_group(cfg).launch(cluster, ...)
#     runner.init_workers(); runner.run()     # the four phases, step after step; eval, checkpoints, metrics
#
# A run is long, so it must survive being stopped: every `save_interval` steps the runner writes a checkpoint
# (the actor's weights and optimizer, every env's state, every worker's random generators) and
# `runner.resume_dir` continues from one — here, exactly as if the run had never stopped.
#
# ## The code to read
#
# - `rlinf_mini/train.py`: `main` (the entry, exit codes), `RunPlan`, `launch`, `build_and_run` (start, run, and
#   stop every worker — also on an error or Ctrl-C).
# - `rlinf_mini/runners/base.py::Runner`: `run` (the step loop: `val_check_interval`, `save_interval`),
#   `save_checkpoint` (a `.tmp` folder renamed last: complete or absent), `load_checkpoint`,
#   `find_latest_checkpoint` (what `resume_dir: auto` picks).
# - `rlinf_mini/utils/metric_logger.py` (`metrics.jsonl`, TensorBoard, the console line; `read_metrics`) and
#   `rlinf_mini/utils/learning_curve.py::plot_learning_curve`.
# - `rlinf_mini/scheduler/worker.py`: `GroupFuture.wait` raises `WorkerError` (a worker raised: its traceback) or
#   `WorkerDiedError` (a worker's process died); `rlinf_mini/scheduler/faults.py` (`RLINF_MINI_FAULT`) fails one on
#   purpose.

# %%
import json
import shutil

import torch
from PIL import Image
from workbench import OUT, ROOT, check_exercise, matches

from rlinf_mini.config import load_config
from rlinf_mini.envs import make_env
from rlinf_mini.envs.video import EvalVideoRecorder
from rlinf_mini.runners.base import find_latest_checkpoint
from rlinf_mini.train import RunPlan, build_and_run
from rlinf_mini.utils.metric_logger import read_metrics

MLP = str(ROOT / "configs/embodied_mlp.yaml")
RUNS = OUT / "runs"

# %% [markdown]
# ## Run it (1): config and plan, before any process starts
#
# The MLP config with a few overrides (the same flags work on the command line: `python -m rlinf_mini.train
# --config configs/embodied_mlp.yaml --runner.max-epochs 10 ...`): 10 training steps, eval every 5, a checkpoint
# every 5. `RunPlan` reads the placement and checks the batch arithmetic; it starts nothing.

# %%
def config(name: str, steps: int, *extra: str):
    return load_config(["--config", MLP, "--runner.max-epochs", str(steps), "--runner.val-check-interval", "5",
                        "--runner.save-interval", "5", "--runner.no-progress-bar",
                        "--runner.logger.log-path", str(RUNS), "--runner.logger.experiment-name", name,
                        "--runner.logger.logger-backends",  # (nothing after it: no TensorBoard)
                        *extra])


for name in ("06_straight", "06_resumed"):  # a rerun starts fresh (resume_dir: auto would pick up the old run)
    shutil.rmtree(RUNS / name, ignore_errors=True)
cfg = config("06_straight", 10)
plan = RunPlan(cfg, "06_full_run")
print(f"world sizes {plan.world_sizes}; run folder {plan.run_dir}")
print(f"{cfg.env.train.total_num_envs} envs x {cfg.env.train.max_steps_per_rollout_epoch} steps per training step, "
      f"pipeline_stage_num {cfg.rollout.pipeline_stage_num}, {cfg.runner.num_steps} steps")

# %%
assert plan.world_sizes == {"env": 1, "rollout": 1, "actor": 2}  # hybrid: env 0, rollout 1, actor 0-1
assert cfg.runner.num_steps == 10 and not plan.run_dir.exists()  # nothing written yet

# %% [markdown]
# ## Run it (2): train 10 steps
#
# `build_and_run` makes the cluster, launches the three groups, runs, and shuts every process down. It returns
# the per-step metrics, which are also the lines of `metrics.jsonl`.

# %%
history = build_and_run(cfg, plan)
run_dir = plan.run_dir
print(sorted(p.name for p in run_dir.iterdir()))
evals = [(h["step"], round(h["eval/success_once"], 3)) for h in history if "eval/success_once" in h]
print("eval success by step:", evals)

# %% [markdown]
# ## What you should see (2)
#
# - The run folder holds `config.yaml` (the resolved config: it loads back equal), `metrics.jsonl`,
#   `checkpoints/`, `learning_curve.png`, and the timeline of the traced steps: `trace.json` (open it in
#   chrome://tracing or ui.perfetto.dev) and `timeline.png`.
# - Eval runs before training (step 0) and at steps 5 and 10: success goes from below 0.1 (the untrained policy
#   rarely reaches a goal) to at least 0.2 more at step 10 (docs/performance.md's Learning results: the full
#   40-step run of this config reaches 0.97).
# - `metrics.jsonl` has one line per step plus the step-0 eval, and the same numbers as the returned history.
# - `checkpoints/` holds `global_step_5` and `global_step_10`, each with the actor (weights, optimizer, an
#   HF-style model folder), `env.pt` (every env rank's state), `rng.pt` (every worker's generators) and
#   `runner.json` (the step).

# %%
assert {"config.yaml", "metrics.jsonl", "checkpoints", "learning_curve.png", "trace.json", "timeline.png"} <= {
    p.name for p in run_dir.iterdir()}
assert load_config(["--config", str(run_dir / "config.yaml")]) == cfg
assert [s for s, _ in evals] == [0, 5, 10]
assert evals[0][1] < 0.1 and evals[-1][1] > evals[0][1] + 0.2, evals  # it learns
metrics = read_metrics(run_dir / "metrics.jsonl")
assert [m["step"] for m in metrics] == [0, *range(1, 11)]
assert [m["eval/success_once"] for m in metrics if "eval/success_once" in m] == [h["eval/success_once"]
                                                                                 for h in history
                                                                                 if "eval/success_once" in h]
ckpt = find_latest_checkpoint(run_dir)
assert ckpt.name == "global_step_10" and (run_dir / "checkpoints/global_step_5").is_dir()
assert sorted(p.name for p in ckpt.iterdir()) == ["actor", "env.pt", "rng.pt", "runner.json"]
assert sorted(p.name for p in (ckpt / "actor").iterdir()) == ["actor.pt", "model"]
assert sorted(torch.load(ckpt / "actor/actor.pt", weights_only=True)) == ["lr_scheduler", "model", "optimizer"]
assert json.loads((ckpt / "runner.json").read_text()) == {"global_step": 10}
assert (run_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"

# %% [markdown]
# ## Reading the metrics
#
# Every line of `metrics.jsonl` is a flat dict: `step`, then `time/` (the four phases under RLinf's timer names,
# `time/step`, and the tracer's busy / idle fractions under `time/trace/`), `env/` (training episodes: return,
# success, length), `rollout/` (mean reward, advantage and return of the step's samples, and the weights'
# staleness), `train/` (losses, clip fraction, grad norm, approximate KL), `sync/` (bytes, GB/s), and `eval/` on
# eval steps. `sync/` is missing on steps 1 and 6: the eval before them (steps 0 and 5) had already sent the
# rollout the weights of that version, and the runner sends a version once. docs/what_you_should_see.md says
# what each should look like. A few columns, the way you would look at them:

# %%
COLUMNS = ["step", "time/step", "time/generate_rollouts", "time/actor_training", "env/return",
           "train/actor/policy_loss", "eval/success_once"]
print("  ".join(f"{c.split('/')[-1]:>16}" for c in COLUMNS))
for m in metrics:
    print("  ".join(f"{m[c]:>16.4g}" if c in m else f"{'':>16}" for c in COLUMNS))
assert all(m["time/generate_rollouts"] + m["time/actor_training"] <= m["time/step"] for m in metrics[1:])
assert all(m["env/steps"] == m["step"] * 32 * 32 for m in metrics[1:])  # 32 envs x 32 steps per training step
assert {k.split("/")[0] for m in metrics[1:] for k in m} == {"step", "time", "env", "rollout", "train", "sync", "eval"}
assert {f"time/{p}" for p in ("sync_weights", "generate_rollouts", "cal_adv_and_returns", "actor_training", "step",
                              "trace/busy/EnvGroup", "trace/idle/ActorGroup")} <= set(metrics[2])
assert {"env/return", "env/success_once", "env/episode_len", "train/actor/clip_fraction", "train/actor/grad_norm",
        "train/actor/approx_kl", "rollout/staleness", "sync/bytes", "sync/GBps"} <= set(metrics[2])
assert [m["step"] for m in metrics if "sync/bytes" in m] == [2, 3, 4, 5, 7, 8, 9, 10]

# %% [markdown]
# The learning curve the run drew (`learning_curve.png`: eval success and eval return against the step). In a
# notebook the next cell shows it; as a script it prints the path.

# %%
try:
    from IPython.display import Image as PNG  # not PIL's Image, imported above
    from IPython.display import display

    get_ipython()  # noqa: F821  (defined only inside IPython / Jupyter)
    display(PNG(filename=str(run_dir / "learning_curve.png")))
except (ImportError, NameError):
    print(run_dir / "learning_curve.png")

# %% [markdown]
# ## Run it (3): stop and resume
#
# Suppose the run above had been stopped after step 5 (Ctrl-C, a crash, the end of a job's time slot): its last
# complete checkpoint would be `global_step_5`. A new process started with `--runner.resume-dir` pointing at that
# folder (or `--runner.resume-dir auto`, which takes the newest complete checkpoint of the run's own folder, as
# `find_latest_checkpoint` finds it) loads it and continues to step 10 — here into a folder of its own, so that
# the two runs can be compared. On the CPU everything that drives a trajectory is either in the checkpoint
# (weights, optimizer, env states, generators) or a function of (seed, env id, step), so the resumed run must
# match the straight one **bitwise**.

# %%
second = config("06_resumed", 10, "--runner.resume-dir", str(run_dir / "checkpoints/global_step_5"))
resumed_plan = RunPlan(second, "06 resumed")
resumed = build_and_run(second, resumed_plan)
print("the resumed run logged steps", [h["step"] for h in resumed])


def logged(rows):  # timings differ between runs; everything else must not
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "sync/"))} for m in rows]


# %% [markdown]
# ## What you should see (3)
#
# The resumed process starts at step 6 (it read `global_step_5`), ends at 10, and its steps 6–10 — losses, returns,
# eval success at 10 — and its final weights and optimizer state equal the straight run's, bitwise.

# %%
assert [h["step"] for h in resumed] == [6, 7, 8, 9, 10]
assert [m["step"] for m in read_metrics(resumed_plan.run_dir / "metrics.jsonl")] == [6, 7, 8, 9, 10]
assert logged(resumed) == logged(history[-5:])
a = torch.load(run_dir / "checkpoints/global_step_10/actor/actor.pt", weights_only=True)
b = torch.load(resumed_plan.run_dir / "checkpoints/global_step_10/actor/actor.pt", weights_only=True)
assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
assert all(torch.equal(torch.as_tensor(x[k]), torch.as_tensor(y[k]))
           for x, y in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True) for k in x)

# %% [markdown]
# ## Run it (4): a worker fails
#
# Long runs meet failures: a bug raises in a worker, the OOM killer ends a process, a simulator segfaults. The
# driver must notice within seconds, say which worker failed (its group and rank) and how, stop every other process,
# and exit with code 1. `RLINF_MINI_FAULT` (`rlinf_mini/scheduler/faults.py`) makes one worker fail on purpose; every
# worker reads it when it starts. Two short runs, each through `main` (what `python -m rlinf_mini.train` runs), with
# what it prints captured:
#
# - actor rank 1 raises in its first `run_training()`: the report carries that worker's own traceback;
# - env rank 0 is killed with SIGKILL in its second `interact()`, while the rollout and the actor wait for its
#   messages in channel gets: no traceback (the process is gone), its pid and the signal instead.
#
# The same from a shell: `RLINF_MINI_FAULT="group=EnvGroup,rank=0,method=interact,call=2,kind=kill9" python -m
# rlinf_mini.train --config configs/embodied_mlp.yaml`. `docs/troubleshooting.md` lists every such message, its
# cause and its fix.

# %%
import contextlib
import io
import os
import re
import time

from rlinf_mini.scheduler import faults
from rlinf_mini.train import main


def run_with_fault(name: str, fault: str) -> tuple[int, str, float]:
    """(exit code, what the driver printed, seconds) of a 3-step run in which `fault` fires."""
    shutil.rmtree(RUNS / name, ignore_errors=True)
    argv = ["--config", MLP, "--runner.max-epochs", "3", "--runner.val-check-interval", "-1",
            "--runner.save-interval", "-1", "--runner.no-progress-bar", "--runner.logger.log-path", str(RUNS),
            "--runner.logger.experiment-name", name, "--runner.logger.logger-backends"]
    os.environ[faults.ENV_VAR] = fault  # the workers inherit the driver's environment when they start
    printed = io.StringIO()
    start = time.monotonic()
    try:
        with contextlib.redirect_stderr(printed):
            code = main(argv)
    finally:
        del os.environ[faults.ENV_VAR]
    return code, printed.getvalue(), time.monotonic() - start


code, raised, seconds = run_with_fault("06_raise", "group=ActorGroup,rank=1,method=run_training,call=1,kind=raise")
print(f"exit code {code} after {seconds:.1f} s; the driver printed:\n{raised}")
code_killed, killed, seconds_killed = run_with_fault("06_kill9",
                                                     "group=EnvGroup,rank=0,method=interact,call=2,kind=kill9")
print(f"exit code {code_killed} after {seconds_killed:.1f} s; the driver printed:\n{killed}")

# %% [markdown]
# ## What you should see (4)
#
# - The raise: exit code 1; the report's first line names the group, the rank and the method (`error: ActorGroup
#   rank 1 raised in run_training()`), then comes the worker's own traceback, ending in the exception it raised.
# - The kill: exit code 1 and one line, `error: EnvGroup rank 0 (pid N) died with signal SIGKILL`; the rollout and
#   the actor, blocked in channel gets for that env's messages, did not wait out their timeout (`cluster.timeout_s`,
#   120 s here, would have ended in a `ChannelTimeout` naming the env): the driver notices a dead worker within a
#   poll interval (0.1 s) and stops every other worker before it returns (`tests/test_faults.py` checks that no
#   process and no /dev/shm segment is left).

# %%
assert code == 1 and code_killed == 1
report = raised[raised.index("error: "):].strip().splitlines()  # (console lines of finished steps may come first)
assert report[0].startswith("error: ActorGroup rank 1 raised in run_training()"), report[0]
assert report[1] == "Traceback (most recent call last):"
assert report[-1] == "rlinf_mini.scheduler.faults.FaultInjected: injected fault in run_training() call 1", report
errors = [line for line in killed.splitlines() if line.startswith("error: ")]
# the death itself, not the ChannelTimeout naming the env that the rollout and the actor would have met later
assert len(errors) == 1 and re.fullmatch(r"error: EnvGroup rank 0 \(pid \d+\) died with signal SIGKILL", errors[0])

# %% [markdown]
# ## Eval gifs, and the default run
#
# With `env.eval.video_cfg.save_video: true` each evaluation writes `videos/step_N/rank<r>_env<i>.gif` into the
# run folder (the first `num_videos` eval sub-envs, upscaled, with the instruction, the return and SUCCESS drawn
# on). The frames are the env's images, so it needs an env that renders: PixelReach-v0 (the default config) or a
# gymnasium env (MuJoCo); the fake reach env of this tutorial has no pixels. The default config turns it on:
#
#     python -m rlinf_mini.train --config configs/embodied.yaml
#
# trains the tiny VLA on PixelReach-v0 for 300 steps (docs/performance.md has its curve) — minutes on 2 cores, too
# long for a tutorial, so we
# read its config here and make one eval gif the way its eval does: the default config's eval env, the recorder
# that `EnvWorker.evaluate` uses (`rlinf_mini/envs/video.py::EvalVideoRecorder`), and random actions in place of
# the policy, for one eval episode of `max_steps_per_rollout_epoch` / C = 6 chunk steps.

# %%
vla = load_config(["--config", str(ROOT / "configs/embodied.yaml")])
print(vla.actor.model.model_type, vla.env.train.init_params.id, vla.runner.num_steps, "steps;",
      "eval gifs:", vla.env.eval.video_cfg.save_video)
assert vla.actor.model.model_type == "tiny_vla" and vla.env.eval.video_cfg.save_video
assert vla.runner.num_steps == 300

C = vla.actor.model.num_action_chunks
eval_env = make_env(vla.env.eval, torch.arange(4), C, key="env.eval")
obs = eval_env.reset()
recorder = EvalVideoRecorder(vla.env.eval.video_cfg, eval_env, obs)
noise = torch.Generator().manual_seed(0)
for _ in range(vla.env.eval.max_steps_per_rollout_epoch // C):
    obs, rewards, terminations, _, _ = eval_env.chunk_step(torch.rand(4, C, 2, generator=noise) * 2 - 1)
    recorder.add(eval_env, obs, rewards, terminations)
gifs = recorder.save(OUT / "06_video", prefix="rank0")
print([str(p.relative_to(OUT)) for p in gifs], "frames:", [Image.open(p).n_frames for p in gifs])

# %%
assert C == 2 and vla.env.eval.max_steps_per_rollout_epoch // C == 6
assert [p.name for p in gifs] == [f"rank0_env{i}.gif" for i in range(4)]  # num_videos: 4
assert all(p.read_bytes()[:4] == b"GIF8" and 2 <= Image.open(p).n_frames <= 7 for p in gifs)  # reset + <= 6 steps

# %% [markdown]
# ## The RLinf counterpart
#
# - `examples/embodiment/train_embodied_agent.py` (Hydra `main`: `validate_cfg`, `Cluster`,
#   `HybridComponentPlacement`, the three `create_group(cfg).launch(...)`, `EmbodiedRunner(...)`,
#   `init_workers()`, `run()`).
# - `rlinf/runners/embodied_runner.py::EmbodiedRunner`: `run`, `evaluate`, `_save_checkpoint` (folders
#   `checkpoints/global_step_N/actor/...`), resume from `runner.resume_dir` (`auto`: the latest).
# - `rlinf/utils/metric_logger.py::MetricLogger` (TensorBoard, W&B, SwanLab), `rlinf/utils/runner_utils.py::
#   check_progress` (when to eval and save).
# - `rlinf/envs/wrappers/record_video.py` (`video_cfg.save_video`, `info_on_video`, `video_base_dir`).
# - Left out here: FSDP/DCP sharded checkpoints, W&B / SwanLab, several nodes.
#
# ## Exercise
#
# `resume_dir: auto` picks the newest complete checkpoint of a run folder. Write `my_latest(run_dir)` returning
# that folder (a `pathlib.Path`), or None when there is none, replacing the body. Each case is named for what it
# tests: an answer that compares the names as text fails "steps with different numbers of digits"; one that
# forgets the folder still being written (`.global_step_N.tmp`) fails "a checkpoint still being written".

# %%
def make_case(name: str, folders: list[str]):
    root = OUT / "06_exercise" / name
    shutil.rmtree(root, ignore_errors=True)
    for f in folders:
        (root / "checkpoints" / f).mkdir(parents=True)
    return (root,)


def my_latest(run_dir):
    # EXERCISE: replace the line below (look at what run_dir / "checkpoints" holds).
    return find_latest_checkpoint(run_dir)


CASES = {
    "one checkpoint": make_case("a", ["global_step_5"]),
    "a checkpoint still being written": make_case("b", ["global_step_9", ".global_step_30.tmp"]),
    "no checkpoint yet": make_case("c", []),
    "steps with different numbers of digits": make_case("d", ["global_step_100", "global_step_99", "global_step_7"]),
    "all of it": make_case("e", ["global_step_5", "global_step_10", "global_step_20", ".global_step_100.tmp"]),
}
check_exercise(my_latest, find_latest_checkpoint, CASES)


def by_name(run_dir):  # compares names as text: "global_step_5" > "global_step_10"
    folders = sorted((run_dir / "checkpoints").glob("global_step_*"))
    return folders[-1] if folders else None


assert not matches(by_name, find_latest_checkpoint, CASES)  # a wrong answer fails
shutil.rmtree(OUT / "06_exercise")
