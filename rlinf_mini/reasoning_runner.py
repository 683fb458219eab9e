"""ReasoningRunner: the GRPO loop for language models on the same runtime as the embodied one. It carries no data
beyond the prompts it puts: rollout, reward and actor are launched together and talk over channels.

One step (RLinf's timer names):
    prepare_data     the loader's next rollout_batch_size prompts -> dataloader channel, in chunks
    sync_weights     actor rank 0 -> every rollout rank (stages/sync.py)
    rollout || reward || actor.run_training   chunk by chunk: a chunk is scored while the next one is generated,
                     and the actor trains once it holds its share
then, every val_check_interval steps, greedy exact match on the held-out prompts (eval/accuracy), and every
save_interval steps an atomic checkpoint (actor weights and optimizer, the loader's position, the step).
With runner.trace, every worker records its spans (rollout: generate per chunk, reward: score per chunk, actor:
logprobs and update; channel waits): trace.json and timeline.png of the first TRACE_FILE_STEPS steps, and
time/trace/{busy,idle}/<component> per step (scheduler/tracer.py).

RLinf counterpart: `rlinf/runners/reasoning_runner.py::ReasoningRunner` (_put_batch, _sync_weights, run,
_save_checkpoint) and `examples/reasoning/main_grpo.py`. Left out: critic, actor-inference groups, dynamic scheduler.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from rlinf_mini.config import TrainConfig
from rlinf_mini.data.prompt_dataset import PromptDataset, PromptLoader
from rlinf_mini.scheduler import tracer
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.worker import WorkerGroup
from rlinf_mini.utils.metric_logger import MetricLogger


class ReasoningRunner:
    def __init__(self, cfg: TrainConfig, actor: WorkerGroup, rollout: WorkerGroup, reward: WorkerGroup, cluster,
                 run_dir: Path, train_set: PromptDataset, val_set: PromptDataset):
        self.cfg, self.actor, self.rollout, self.reward = cfg, actor, rollout, reward
        self.run_dir = Path(run_dir)
        self.train_set, self.val_set = train_set, val_set
        # one message per (channel, chunk key) per step
        self.dataloader_channel = Channel.create("DataLoader", cluster, maxsize=1)
        self.rollout_channel = Channel.create(f"{cfg.rollout.group_name}.Rollout", cluster, maxsize=1)
        self.reward_channel = Channel.create(f"{cfg.reward.group_name}.Reward", cluster, maxsize=1)
        d = cfg.data
        self.loader = PromptLoader(len(train_set), d.rollout_batch_size, d.shuffle, d.seed)
        self.chunk_prompts = cfg.algorithm.rollout_batch_size_per_gpu
        self.num_chunks = d.rollout_batch_size // self.chunk_prompts
        self.global_step = 0
        self.rollout_version = -1
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

    def init_workers(self) -> None:
        rollout_init = self.rollout.init_worker()
        reward_init = self.reward.init_worker(self.rollout.world_size)
        self.weight_handles = rollout_init.wait()
        reward_init.wait()
        self.actor.init_worker().wait()
        if self.cfg.runner.trace:
            tracer.enable()
            for group in (self.rollout, self.reward, self.actor):
                group.trace_enable().wait()
        resume = self.cfg.runner.resume_dir
        if resume == "auto":
            folders = [p for p in (self.run_dir / "checkpoints").glob("global_step_*") if p.is_dir()]
            resume = max(folders, key=lambda p: int(p.name.rsplit("_", 1)[1]), default=None)
        if resume:
            self.load_checkpoint(Path(resume))

    def _put_batch(self, indices: list[int]) -> None:
        """Cut the step's prompts into chunks; chunk c's responses have global sample ids from first_sample_id."""
        per_step = self.cfg.data.rollout_batch_size * self.cfg.algorithm.group_size
        for c in range(self.num_chunks):
            idx = indices[c * self.chunk_prompts:(c + 1) * self.chunk_prompts]
            self.dataloader_channel.put({
                "prompt_ids": [self.train_set.prompt_ids[i] for i in idx],
                "answers": [self.train_set.answers[i] for i in idx],
                "first_sample_id": self.global_step * per_step + c * self.chunk_prompts * self.cfg.algorithm.group_size,
            }, key=("prompts", c))

    def update_rollout_weights(self) -> dict[str, float]:
        version = self.global_step
        if version == self.rollout_version:
            return {}
        receive = self.rollout.sync_model_from_actor(version)
        sent = self.actor.sync_model_to_rollout(self.weight_handles, version).wait()[0]
        receive.wait()
        self.rollout_version = version
        return sent

    def evaluate(self) -> dict[str, float]:
        """Greedy responses to every held-out prompt, split over the rollout ranks; exact match by the verifier."""
        chunk = self.chunk_prompts * self.cfg.algorithm.group_size
        per_rank = self.rollout.evaluate(self.val_set.prompt_ids, self.val_set.answers, chunk).wait()
        correct = sum(flat[1::2].count(1.0) for flat in per_rank)
        return {"eval/accuracy": correct / len(self.val_set)}

    def step(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        with self.timer("step"):
            with self.timer("prepare_data"):
                self._put_batch(self.loader.next_batch())
            with self.timer("sync_weights"):
                if self.global_step % self.cfg.runner.weight_sync_interval == 0:
                    metrics |= self.update_rollout_weights()
            with self.timer("generate_and_train"):
                rollout_run = self.rollout.rollout(self.dataloader_channel, self.rollout_channel, self.num_chunks)
                reward_run = self.reward.compute_rewards(self.rollout_channel, self.reward_channel, self.num_chunks)
                actor_run = self.actor.run_training(self.reward_channel, self.num_chunks, self.global_step,
                                                    self.reward.world_size)
                metrics |= actor_run.wait()[0]
                rollout_metrics, reward_metrics = rollout_run.wait(), reward_run.wait()
        n = sum(m["reward/count"] for m in reward_metrics)
        metrics["rollout/accuracy"] = sum(m["reward/correct"] for m in reward_metrics) / n
        metrics["rollout/tokens_per_s"] = sum(m["rollout/tokens"] for m in rollout_metrics) / max(
            max(m["time/rollout/generate"] for m in rollout_metrics), 1e-9)
        metrics["time/rollout"] = max(m["time/rollout/generate"] for m in rollout_metrics)
        metrics["time/reward"] = max(m["time/reward/compute"] for m in reward_metrics)
        return metrics | self.timings

    def run(self) -> list[dict[str, float]]:
        cfg = self.cfg.runner
        self.logger = MetricLogger(cfg.logger, self.run_dir, resume_step=self.global_step)
        try:
            if self.global_step == 0 and cfg.val_before_train and cfg.val_check_interval > 0:
                self.update_rollout_weights()
                self._log(self.evaluate(), step=0)
            while self.global_step < self.max_steps:
                self.timings = {}
                metrics = self.step()
                self.global_step += 1
                if cfg.trace:
                    metrics |= self.gather_trace()
                    if self.global_step == self.TRACE_FILE_STEPS:
                        self.write_trace()
                if self._due(cfg.val_check_interval):
                    with self.timer("eval"):
                        self.update_rollout_weights()
                        metrics |= self.evaluate()
                    metrics["time/eval"] = self.timings["time/eval"]
                if self._due(cfg.save_interval):
                    self.save_checkpoint()
                self._log(metrics, step=self.global_step)
            if self.trace_spans and self.global_step < self.TRACE_FILE_STEPS:
                self.write_trace()
        finally:
            self.logger.close()
        plot_reasoning_curve(self.history, self.run_dir / "learning_curve.png")
        return self.history

    # --- timeline ------------------------------------------------------------------------------------------------

    TRACE_FILE_STEPS = 20  # as the embodied runner: trace.json keeps the first steps only

    def gather_trace(self) -> dict[str, float]:
        """Collect every worker's spans of the step that just ended; returns its time/trace/* metrics."""
        futures = [group.trace_drain() for group in (self.rollout, self.reward, self.actor)]
        spans = tracer.drain() + [s for f in futures for per_rank in f.wait() for s in per_rank]
        step = max((s for s in spans if s[0] == "driver" and s[2] == "step"), key=lambda s: s[4], default=None)
        if step is None:
            return {}
        if self.global_step <= self.TRACE_FILE_STEPS:
            self.trace_spans += spans
            self.last_step_window, self.last_traced_step = (step[4], step[5]), self.global_step
        return tracer.step_metrics(spans, step[4], step[5])

    def write_trace(self) -> None:
        """trace.json (every traced step) and timeline.png (the last traced step) into the run folder."""
        tracer.write_chrome_trace(self.trace_spans, self.run_dir / "trace.json")
        t0, t1 = self.last_step_window
        last = [s for s in self.trace_spans if s[5] > t0 and s[4] < t1]
        tracer.write_timeline_png(last, self.run_dir / "timeline.png", step=self.last_traced_step,
                                  title="rlinf_mini reasoning: rollout || reward || actor, chunk by chunk")

    def _due(self, interval: int) -> bool:
        return interval > 0 and (self.global_step % interval == 0 or self.global_step == self.max_steps)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.history.append({"step": step, **metrics})
        self.logger.log(metrics, step)
        if step % self.cfg.runner.log_interval == 0 or "eval/accuracy" in metrics:
            keys = ("rollout/accuracy", "eval/accuracy", "train/actor/approx_kl", "time/step")
            parts = [f"step {step}"] + [f"{k} {metrics[k]:.3g}" for k in keys if k in metrics]
            print(" | ".join(parts), file=sys.stderr, flush=True)

    # --- checkpoints ---------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """checkpoints/global_step_N, written into a .tmp folder renamed last (complete or absent)."""
        root = self.run_dir / "checkpoints"
        final, tmp = root / f"global_step_{self.global_step}", root / f".global_step_{self.global_step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.actor.execute_on(0).save_checkpoint(str(tmp / "actor.pt")).wait()
        state = {"global_step": self.global_step, "loader": self.loader.state_dict()}
        (tmp / "runner.json").write_text(json.dumps(state))
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        return final

    def load_checkpoint(self, folder: Path) -> None:
        if not (folder / "runner.json").is_file():
            raise FileNotFoundError(f"runner.resume_dir: {folder} is not a complete checkpoint (no runner.json)")
        self.actor.load_checkpoint(str(folder / "actor.pt")).wait()
        state = json.loads((folder / "runner.json").read_text())
        self.global_step = state["global_step"]
        self.loader.load_state_dict(state["loader"])


def plot_reasoning_curve(history: list[dict[str, float]], path: Path) -> Path | None:
    """learning_curve.png: held-out greedy exact match and the sampled train accuracy against the step."""
    evals = [h for h in history if "eval/accuracy" in h]
    if not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot([h["step"] for h in evals], [h["eval/accuracy"] for h in evals], marker="o", label="eval/accuracy (greedy)")
    train = [h for h in history if "rollout/accuracy" in h]
    ax.plot([h["step"] for h in train], [h["rollout/accuracy"] for h in train], alpha=0.5,
            label="rollout/accuracy (sampled)")
    ax.set(xlabel="training step", ylabel="exact match", ylim=(-0.02, 1.02), title="reasoning: held-out exact match")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

