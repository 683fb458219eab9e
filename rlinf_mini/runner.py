"""EmbodiedRunner: the training loop that composes the five stages. It carries no data: it creates the channels,
passes them into group calls, and waits.

One step (RLinf's timer names):
    sync_weights         update_rollout_weights()        actor rank 0 -> every rollout rank        (stage 2)
    generate_rollouts    env.interact || rollout.generate || actor.recv_rollout_trajectories      (stage 3)
    cal_adv_and_returns  actor.compute_advantages_and_returns()                                   (stage 4)
    actor_training       actor.run_training()                                                     (stage 5)
then, every `val_check_interval` steps, an evaluation, and every `save_interval` steps, a checkpoint.

RLinf counterpart: `rlinf/runners/embodied_runner.py::EmbodiedRunner` (init_workers, update_rollout_weights,
generate_rollouts, evaluate, run, _save_checkpoint). Left out: reward workers, async variants, profiler windows.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from rlinf_mini.config import EnvSplitConfig, TrainConfig
from rlinf_mini.scheduler import tracer
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.worker import WorkerGroup
from rlinf_mini.utils.learning_curve import plot_learning_curve
from rlinf_mini.utils.metric_logger import MetricLogger

RUN_FILES = ("metrics.jsonl", "checkpoints", "tensorboard")  # what a run leaves in its folder


def holds_a_run(run_dir: Path) -> bool:
    """Whether an earlier run wrote into `run_dir`: a new run there must resume it, or it would mix two runs' metrics
    and leave the old checkpoints where `resume_dir: auto` finds them."""
    return any((Path(run_dir) / name).exists() for name in RUN_FILES)


def env_steps_per_training_step(train: EnvSplitConfig) -> int:
    """Sub-env steps of one training step (the `env/steps` metric grows by this much per step)."""
    return train.total_num_envs * train.max_steps_per_rollout_epoch * train.rollout_epoch


def find_latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder (incomplete ones are still named .tmp and are ignored)."""
    folders = [p for p in (run_dir / "checkpoints").glob("global_step_*") if p.is_dir()]
    return max(folders, key=lambda p: int(p.name.rsplit("_", 1)[1]), default=None)


class EmbodiedRunner:
    def __init__(self, cfg: TrainConfig, actor: WorkerGroup, rollout: WorkerGroup, env: WorkerGroup, cluster,
                 run_dir: Path):
        self.cfg, self.actor, self.rollout, self.env, self.cluster = cfg, actor, rollout, env, cluster
        self.run_dir = Path(run_dir)
        self.world_sizes = {"env": env.world_size, "rollout": rollout.world_size, "actor": actor.world_size}
        stages = cfg.rollout.pipeline_stage_num
        # env <-> rollout queues hold at most one message per (mode, env rank, stage) key in flight, plus slack
        self.env_channel = Channel.create(f"{cfg.env.group_name}.Env", cluster, maxsize=stages + 1)
        self.rollout_channel = Channel.create(f"{cfg.rollout.group_name}.Rollout", cluster, maxsize=stages + 1)
        # one trajectory piece per key per step (keys are piece indices)
        self.actor_channel = Channel.create(f"{cfg.actor.group_name}.Actor", cluster, maxsize=1)
        self.global_step = 0
        self.rollout_version = -1  # the weight version the rollout holds (-1: none yet)
        self.max_steps = cfg.runner.num_steps
        self.timings: dict[str, float] = {}
        self.history: list[dict[str, float]] = []
        self.trace_spans: list[tracer.Span] = []  # the first TRACE_FILE_STEPS steps, for trace.json

    @contextlib.contextmanager
    def timer(self, name: str):
        start = time.monotonic()
        with tracer.span(name):
            yield
        self.timings[f"time/{name}"] = time.monotonic() - start

    # --- setup ---------------------------------------------------------------------------------------------------

    def init_workers(self) -> None:
        """Rollout and env build at the same time; then the actor. Resume if runner.resume_dir says so."""
        rollout_init = self.rollout.init_worker(self.world_sizes)
        env_init = self.env.init_worker(self.world_sizes)
        self.weight_handles = rollout_init.wait()
        env_init.wait()
        self.actor.init_worker(self.world_sizes).wait()
        if self.cfg.runner.trace:
            tracer.enable()
            for group in (self.env, self.rollout, self.actor):
                group.trace_enable().wait()
        resume = self.cfg.runner.resume_dir
        if resume == "auto":
            resume = find_latest_checkpoint(self.run_dir)
        if resume:
            self.load_checkpoint(Path(resume))

    # --- the four phases -----------------------------------------------------------------------------------------

    def update_rollout_weights(self) -> dict[str, float]:
        """Send the actor's weights to every rollout rank, unless the rollout already holds this version."""
        version = self.global_step  # training steps behind the actor's weights (one holds many optimizer steps)
        if version == self.rollout_version:
            return {}
        receive = self.rollout.sync_model_from_actor(version)
        send = self.actor.sync_model_to_rollout(self.weight_handles, version)
        sent = send.wait()[0]  # actor rank 0's "sync/*" figures
        receive.wait()
        self.rollout_version = version
        return sent

    def generate_rollouts(self) -> dict[str, float]:
        env_run = self.env.interact(self.rollout_channel, self.env_channel, self.actor_channel, self.global_step)
        rollout_run = self.rollout.generate(self.rollout_channel, self.env_channel)
        self.actor.recv_rollout_trajectories(self.actor_channel).wait()
        rollout_metrics = rollout_run.wait()
        env_metrics = env_run.wait()
        return _mean_over_ranks(env_metrics) | {
            "rollout/samples": sum(m["rollout/samples"] for m in rollout_metrics),
            "time/rollout/generate": max(m["time/rollout/generate"] for m in rollout_metrics),
        }

    def evaluate(self) -> dict[str, float]:
        video_cfg = self.cfg.env.eval.video_cfg
        video_dir = ""
        if video_cfg.save_video:  # one gif per recorded eval sub-env: <video_base_dir>/step_<N>/rank<r>_env<i>.gif
            video_dir = str(Path(video_cfg.video_base_dir or self.run_dir / "videos") / f"step_{self.global_step}")
        env_run = self.env.evaluate(self.rollout_channel, self.env_channel, video_dir)
        self.rollout.evaluate(self.rollout_channel, self.env_channel).wait()
        per_rank = env_run.wait()
        total = {k: sum(m[k] for m in per_rank) for k in per_rank[0]}
        n = total["eval/num_episodes"]
        return {
            "eval/success_once": total["eval/success_once_sum"] / total["eval/num_envs"],
            "eval/return": total["eval/return_sum"] / n if n else float("nan"),
            "eval/num_episodes": n,
        }

    def run(self) -> list[dict[str, float]]:
        """Train until max steps; returns the per-step metrics (also in metrics.jsonl)."""
        cfg = self.cfg.runner
        self.logger = MetricLogger(cfg.logger, self.run_dir, resume_step=self.global_step)
        bar = None
        if cfg.progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=self.max_steps, initial=self.global_step, desc="train", file=sys.stderr,
                       dynamic_ncols=True)
        try:
            if self.global_step == 0 and cfg.val_before_train and cfg.val_check_interval > 0:
                self.update_rollout_weights()
                self._log(self.evaluate(), step=0, bar=bar)
            while self.global_step < self.max_steps:
                metrics = self.train_step()
                if self.cfg.runner.trace:
                    metrics |= self.gather_trace()
                    if self.global_step == self.TRACE_FILE_STEPS:
                        self.write_trace()
                metrics["env/steps"] = float(self.global_step * env_steps_per_training_step(self.cfg.env.train))
                if self._due(cfg.val_check_interval):
                    with self.timer("eval"):
                        self.update_rollout_weights()
                        metrics |= self.evaluate()
                    metrics["time/eval"] = self.timings["time/eval"]
                if self._due(cfg.save_interval):
                    self.save_checkpoint()
                self._log(metrics, step=self.global_step, bar=bar)
            if self.trace_spans and self.global_step < self.TRACE_FILE_STEPS:
                self.write_trace()  # not in `finally`: Ctrl-C and errors stop at once, without drawing a chart
        finally:
            if bar is not None:
                bar.close()
            self.logger.close()
        plot_learning_curve(self.history, self.run_dir / "learning_curve.png")
        return self.history

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

    # --- timeline ------------------------------------------------------------------------------------------------

    TRACE_FILE_STEPS = 20  # trace.json keeps the first steps only (a long run would make a file of many MB)

    def gather_trace(self) -> dict[str, float]:
        """Collect every worker's spans of the step that just ended; returns its time/trace/* metrics."""
        futures = [group.trace_drain() for group in (self.env, self.rollout, self.actor)]
        spans = tracer.drain() + [s for f in futures for per_rank in f.wait() for s in per_rank]
        step = max((s for s in spans if s[0] == "driver" and s[2] == "step"), key=lambda s: s[4], default=None)
        if step is None:
            return {}
        gen = [s for s in spans if s[0] == "driver" and s[2] == "generate_rollouts" and s[4] >= step[4]]
        if self.global_step <= self.TRACE_FILE_STEPS:
            self.trace_spans += spans
            self.last_step_window = (step[4], step[5])
            self.last_traced_step = self.global_step  # the step number metrics.jsonl logs it under
        return tracer.step_metrics(spans, step[4], step[5], window=(gen[0][4], gen[0][5]) if gen else None)

    def write_trace(self) -> None:
        """trace.json (every traced step) and timeline.png (the last traced step) into the run folder."""
        tracer.write_chrome_trace(self.trace_spans, self.run_dir / "trace.json")
        t0, t1 = self.last_step_window
        last = [s for s in self.trace_spans if s[5] > t0 and s[4] < t1]
        tracer.write_timeline_png(last, self.run_dir / "timeline.png", step=self.last_traced_step,
                                  title=f"rlinf_mini, pipeline_stage_num={self.cfg.rollout.pipeline_stage_num}")

    def _due(self, interval: int) -> bool:
        return interval > 0 and (self.global_step % interval == 0 or self.global_step == self.max_steps)

    def _log(self, metrics: dict[str, float], step: int, bar) -> None:
        self.history.append({"step": step, **metrics})
        self.logger.log(metrics, step)
        line = MetricLogger.console_line(metrics, step)
        if bar is not None:
            bar.update(step - bar.n)
            if step % self.cfg.runner.log_interval == 0 or "eval/success_once" in metrics:
                bar.write(line, file=sys.stderr)
        elif step % self.cfg.runner.log_interval == 0 or "eval/success_once" in metrics:
            print(line, file=sys.stderr, flush=True)

    # --- checkpoints ---------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Write checkpoints/global_step_N atomically: everything goes into a .tmp folder that is renamed last."""
        root = self.run_dir / "checkpoints"
        final = root / f"global_step_{self.global_step}"
        tmp = root / f".global_step_{self.global_step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.actor.execute_on(0).save_checkpoint(str(tmp / "actor")).wait()
        torch.save(self.env.get_state().wait(), tmp / "env.pt")
        # every rank's global generators (python, numpy, torch): a resumed worker draws what it would have drawn
        torch.save({g.name: [_rng_to_plain(s) for s in g.get_rng_state().wait()]
                    for g in (self.actor, self.rollout, self.env)}, tmp / "rng.pt")
        (tmp / "runner.json").write_text(json.dumps({"global_step": self.global_step}))
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)  # atomic on one filesystem: a checkpoint folder is complete or absent
        return final

    def load_checkpoint(self, folder: Path) -> None:
        if not (folder / "runner.json").is_file():
            raise FileNotFoundError(f"runner.resume_dir: {folder} is not a complete checkpoint (no runner.json)")
        self.actor.load_checkpoint(str(folder / "actor")).wait()
        env_states = torch.load(folder / "env.pt", weights_only=True)  # a checkpoint from elsewhere runs no code
        if len(env_states) != self.env.world_size:
            raise ValueError(f"runner.resume_dir: {folder} has {len(env_states)} env ranks, this run has "
                             f"{self.env.world_size}")
        for rank, state in enumerate(env_states):
            self.env.execute_on(rank).set_state(state).wait()
        rng = torch.load(folder / "rng.pt", weights_only=True) if (folder / "rng.pt").is_file() else {}
        for group in (self.actor, self.rollout, self.env):
            states = [_rng_from_plain(s) for s in rng.get(group.name, [])]
            for rank, state in enumerate(states[: group.world_size]):  # a different world size: new ranks unseeded
                group.execute_on(rank).set_rng_state(state).wait()
        self.global_step = json.loads((folder / "runner.json").read_text())["global_step"]


def _rng_to_plain(state: dict) -> dict:
    """numpy's generator state holds an ndarray, which torch.load(weights_only=True) refuses: store it as a tensor."""
    name, keys, pos, has_gauss, gauss = state["numpy"]
    return state | {"numpy": (name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss)}


def _rng_from_plain(state: dict) -> dict:
    name, keys, pos, has_gauss, gauss = state["numpy"]
    return state | {"numpy": (name, keys.numpy().astype("uint32"), pos, has_gauss, gauss)}


def _mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Average each metric over ranks, ignoring NaN (a rank whose envs finished no episode)."""
    out = {}
    for k in per_rank[0]:
        vals = [m[k] for m in per_rank if not math.isnan(m[k])]
        out[k] = sum(vals) / len(vals) if vals else float("nan")
    return out
