"""EmbodiedRunner: the embodied half's step, the four stages in order; the loop around it is runners/base.py. It
carries no data: it creates the channels, passes them into group calls, and waits.

One step (RLinf's timer names):
    sync_weights         update_rollout_weights()        actor rank 0 -> every rollout rank        (stage 2)
    generate_rollouts    env.interact || rollout.generate || actor.recv_rollout_trajectories      (stage 3)
    cal_adv_and_returns  actor.compute_advantages_and_returns()                                   (stage 4)
    actor_training       actor.run_training()                                                     (stage 5)
then, every `val_check_interval` steps, an evaluation, and every `save_interval` steps, a checkpoint (the actor's
weights and optimizer, every env rank's state, rng.pt, runner.json).

RLinf counterpart: `rlinf/runners/embodied_runner.py::EmbodiedRunner` (init_workers, update_rollout_weights,
generate_rollouts, evaluate, run, _save_checkpoint). Left out: reward workers, async variants, profiler windows.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from rlinf_mini.config import EnvSplitConfig, TrainConfig
from rlinf_mini.runners.base import Runner
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.worker import WorkerGroup
from rlinf_mini.utils.learning_curve import plot_learning_curve


def env_steps_per_training_step(train: EnvSplitConfig) -> int:
    """Sub-env steps of one training step (the `env/steps` metric grows by this much per step)."""
    return train.total_num_envs * train.max_steps_per_rollout_epoch * train.rollout_epoch


class EmbodiedRunner(Runner):
    EVAL_KEY = "eval/success_once"
    PROGRESS_BAR = True
    TRACE_WINDOW = "generate_rollouts"  # the trace's overlap metrics measure the rollout phase

    def __init__(self, cfg: TrainConfig, actor: WorkerGroup, rollout: WorkerGroup, env: WorkerGroup, cluster,
                 run_dir: Path):
        super().__init__(cfg, actor, rollout, (env, rollout, actor), run_dir)
        self.env, self.cluster = env, cluster
        self.world_sizes = {"env": env.world_size, "rollout": rollout.world_size, "actor": actor.world_size}
        stages = cfg.rollout.pipeline_stage_num
        # env <-> rollout queues hold at most one message per (mode, env rank, stage) key in flight, plus slack
        self.env_channel = Channel.create(f"{cfg.env.group_name}.Env", cluster, maxsize=stages + 1)
        self.rollout_channel = Channel.create(f"{cfg.rollout.group_name}.Rollout", cluster, maxsize=stages + 1)
        # one trajectory piece per key per batch in flight (keys are piece indices)
        self.actor_channel = Channel.create(f"{cfg.actor.group_name}.Actor", cluster,
                                            maxsize=self.batches_in_flight())

    def batches_in_flight(self) -> int:
        """The most rollout batches produced and not yet taken by the actor: one (the async runner's: more)."""
        return 1

    def init_workers(self) -> None:
        """Rollout and env build at the same time; then the actor. Resume if runner.resume_dir says so."""
        rollout_init = self.rollout.init_worker(self.world_sizes)
        env_init = self.env.init_worker(self.world_sizes)
        self.weight_handles = rollout_init.wait()
        env_init.wait()
        self.actor.init_worker(self.world_sizes).wait()
        self._trace_and_resume()

    # --- the four phases -----------------------------------------------------------------------------------------

    def generate_rollouts(self) -> dict[str, float]:
        env_run = self.env.interact(self.rollout_channel, self.env_channel, self.actor_channel, self.global_step)
        rollout_run = self.rollout.generate(self.rollout_channel, self.env_channel)
        self.actor.recv_rollout_trajectories(self.actor_channel).wait()
        return generation_metrics(env_run.wait(), rollout_run.wait())

    def evaluate(self) -> dict[str, float]:
        video_cfg = self.cfg.env.eval.video_cfg
        video_dir = ""
        if video_cfg.save_video:  # one gif per recorded eval sub-env: <video_base_dir>/step_<N>/rank<r>_env<i>.gif
            video_dir = str(Path(video_cfg.video_base_dir or self.run_dir / "videos") / f"step_{self.global_step}")
        env_run = self.env.evaluate(self.rollout_channel, self.env_channel, video_dir)
        self.rollout.evaluate(self.rollout_channel, self.env_channel).wait()
        per_rank = env_run.wait()
        names = dict.fromkeys(k for m in per_rank for k in m)  # ranks may hold different tasks
        total = {k: sum(m.get(k, 0.0) for m in per_rank) for k in names}
        n = total["eval/num_episodes"]
        return {
            "eval/success_once": total["eval/success_once_sum"] / total["eval/num_envs"],
            "eval/return": total["eval/return_sum"] / n if n else float("nan"),
            "eval/num_episodes": n,
            **({"eval/success_at_end": total["eval/success_at_end_sum"] / total["eval/num_envs"]}
               if "eval/success_at_end_sum" in total else {}),
            **{f"eval/success_once/{k.split('/')[-1]}": total[f"eval/success_once/{k.split('/')[-1]}_sum"] / v
               for k, v in total.items() if k.startswith("eval/num_envs/")},
        }

    def train_step(self) -> dict[str, float]:
        """One training step, the four phases in order (tests and tutorials call this, not a copy of it); returns
        the step's metrics with its timings. global_step counts the steps done."""
        self.timings = {}
        metrics: dict[str, float] = {}
        with self.timer("step"):
            self.actor.set_global_step(self.global_step).wait()
            with self.timer("sync_weights"):
                if self.global_step % self.cfg.runner.weight_sync_interval == 0:
                    metrics |= self.update_rollout_weights()
            with self.timer("generate_rollouts"):
                metrics |= self.generate_rollouts()
            with self.timer("cal_adv_and_returns"):
                metrics |= self.actor.compute_advantages_and_returns().wait()[0]
            with self.timer("actor_training"):
                metrics |= self.actor.run_training().wait()[0]
        self.global_step += 1
        return metrics | self.timings

    # --- what the loop asks of this half -------------------------------------------------------------------------

    def step_metrics(self) -> dict[str, float]:
        return {"env/steps": float(self.global_step * env_steps_per_training_step(self.cfg.env.train))}

    def plot_curve(self) -> None:
        plot_learning_curve(self.history, self.run_dir / "learning_curve.png")

    def trace_title(self) -> str:
        return f"rlinf_mini, pipeline_stage_num={self.cfg.rollout.pipeline_stage_num}"

    def _save_checkpoint(self, folder: Path) -> None:
        self.actor.execute_on(0).save_checkpoint(str(folder / "actor")).wait()
        torch.save(self.env.get_state().wait(), folder / "env.pt")

    def _load_checkpoint(self, folder: Path, state: dict) -> None:
        self.actor.load_checkpoint(str(folder / "actor")).wait()
        env_states = torch.load(folder / "env.pt", weights_only=True)  # a checkpoint from elsewhere runs no code
        if len(env_states) != self.env.world_size:
            raise ValueError(f"runner.resume_dir: {folder} has {len(env_states)} env ranks, this run has "
                             f"{self.env.world_size}")
        for rank, env_state in enumerate(env_states):
            self.env.execute_on(rank).set_state(env_state).wait()


def generation_metrics(env_metrics: list[dict[str, float]], rollout_metrics: list[dict[str, float]]
                       ) -> dict[str, float]:
    """One batch's env metrics (mean over env ranks) and rollout metrics (samples summed, the slowest rank's time)."""
    return _mean_over_ranks(env_metrics) | {
        "rollout/samples": sum(m["rollout/samples"] for m in rollout_metrics),
        "time/rollout/generate": max(m["time/rollout/generate"] for m in rollout_metrics),
    }


def _mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Average each metric over ranks, ignoring NaN (a rank whose envs finished no episode)."""
    out = {}
    for k in dict.fromkeys(k for m in per_rank for k in m):  # a per-task metric only where that task runs
        vals = [m[k] for m in per_rank if k in m and not math.isnan(m[k])]
        out[k] = sum(vals) / len(vals) if vals else float("nan")
    return out
