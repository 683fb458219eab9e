"""Runner: the step loop both halves share, written once: eval cadence, checkpoint/resume (RNG state included),
metrics and console lines, the learning curve, the trace.

A half (runners/embodied.py, runners/reasoning.py) starts its groups in `init_workers`, runs one training step in
`train_step`, scores the held-out set in `evaluate`, and names what else its checkpoint holds (`_save_checkpoint`,
`_load_checkpoint`, `_runner_state`). Everything else is here:

    run(): [eval at step 0] -> until max steps: train_step, trace, [eval], [checkpoint], log -> learning_curve.png

A checkpoint is checkpoints/global_step_N: what the half writes, rng.pt (every rank's python, numpy and torch
generators) and runner.json (the step, and the half's own state), written into a .tmp folder renamed last.

RLinf counterpart: what `rlinf/runners/embodied_runner.py` and `reasoning_runner.py` each write on their own
(run, _save_checkpoint, the timer, the metric logger).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from rlinf_mini.config import TrainConfig
from rlinf_mini.scheduler import tracer
from rlinf_mini.scheduler.worker import WorkerGroup
from rlinf_mini.utils.metric_logger import MetricLogger

RUN_FILES = ("metrics.jsonl", "checkpoints", "tensorboard")  # what a run leaves in its folder


def holds_a_run(run_dir: Path) -> bool:
    """Whether an earlier run wrote into `run_dir`: a new run there must resume it, or it would mix two runs' metrics
    and leave the old checkpoints where `resume_dir: auto` finds them."""
    return any((Path(run_dir) / name).exists() for name in RUN_FILES)


def find_latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder (incomplete ones are still named .tmp and are ignored)."""
    folders = [p for p in (run_dir / "checkpoints").glob("global_step_*") if p.is_dir()]
    return max(folders, key=lambda p: int(p.name.rsplit("_", 1)[1]), default=None)



def progress_bar(wanted: bool, total: int, initial: int, stream):
    """A tqdm bar on `stream` when wanted and the stream is a terminal, else None. Off a terminal (a log file, nohup,
    CI) a bar's carriage-return redraws would run into the metric lines: those lines alone are printed, one per
    runner.log_interval steps and one per eval."""
    if not (wanted and stream.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="train", file=stream, dynamic_ncols=True)

class Runner:
    """What a half sets: `groups` (every worker group, for traces and RNG state), `EVAL_KEY` (the metric that makes
    an eval step print), `PROGRESS_BAR` (whether runner.progress_bar applies), `TRACE_WINDOW` (the driver span whose
    overlap the trace metrics measure, or None)."""

    TRACE_FILE_STEPS = 20  # trace.json keeps the first steps only (a long run would make a file of many MB)
    EVAL_KEY = ""
    PROGRESS_BAR = False
    TRACE_WINDOW: str | None = None

    def __init__(self, cfg: TrainConfig, actor: WorkerGroup, rollout: WorkerGroup, groups: tuple[WorkerGroup, ...],
                 run_dir: Path):
        self.cfg, self.actor, self.rollout, self.groups = cfg, actor, rollout, groups
        self.run_dir = Path(run_dir)
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

    # --- what a half writes ------------------------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        raise NotImplementedError

    def step_metrics(self) -> dict[str, float]:
        """Metrics a half adds to every step's line after the trace (none by default)."""
        return {}

    def plot_curve(self) -> None:
        """learning_curve.png from self.history."""

    def console_line(self, metrics: dict[str, float], step: int) -> str:
        return MetricLogger.console_line(metrics, step)

    def trace_title(self) -> str:
        return "rlinf_mini"

    def _save_checkpoint(self, folder: Path) -> None:
        """The half's files in the checkpoint folder (the actor's weights and optimizer, ...)."""

    def _load_checkpoint(self, folder: Path, state: dict) -> None:
        """Read back what _save_checkpoint wrote; `state` is runner.json."""

    def _runner_state(self) -> dict:
        """What runner.json holds beside global_step."""
        return {}

    # --- setup ---------------------------------------------------------------------------------------------------

    def _trace_and_resume(self) -> None:
        """The end of init_workers: switch every group's tracer on if runner.trace, resume if runner.resume_dir."""
        if self.cfg.runner.trace:
            tracer.enable()
            for group in self.groups:
                group.trace_enable().wait()
        resume = self.cfg.runner.resume_dir
        if resume == "auto":
            resume = find_latest_checkpoint(self.run_dir)
        if resume:
            self.load_checkpoint(Path(resume))

    def update_rollout_weights(self) -> dict[str, float]:
        """Send the actor's weights to every rollout rank, unless the rollout already holds this version."""
        version = self.global_step  # training steps behind the actor's weights (one holds many optimizer steps)
        if version == self.rollout_version:
            return {}
        receive = self.rollout.sync_model_from_actor(version)
        sent = self.actor.sync_model_to_rollout(self.weight_handles, version).wait()[0]  # rank 0's "sync/*"
        receive.wait()
        self.rollout_version = version
        return sent

    # --- the loop ------------------------------------------------------------------------------------------------

    def run(self) -> list[dict[str, float]]:
        """Train until max steps; returns the per-step metrics (also in metrics.jsonl)."""
        cfg = self.cfg.runner
        self.logger = MetricLogger(cfg.logger, self.run_dir, resume_step=self.global_step)
        bar = progress_bar(self.PROGRESS_BAR and cfg.progress_bar, self.max_steps, self.global_step, sys.stderr)
        try:
            if self.global_step == 0 and cfg.val_before_train and cfg.val_check_interval > 0:
                self.update_rollout_weights()
                self._log(self.evaluate(), step=0, bar=bar)
            while self.global_step < self.max_steps:
                metrics = self.train_step()
                if cfg.trace:
                    metrics |= self.gather_trace()
                    if self.global_step == self.TRACE_FILE_STEPS:
                        self.write_trace()
                metrics |= self.step_metrics()
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
        self.plot_curve()
        return self.history

    def _due(self, interval: int) -> bool:
        return interval > 0 and (self.global_step % interval == 0 or self.global_step == self.max_steps)

    def _log(self, metrics: dict[str, float], step: int, bar=None) -> None:
        self.history.append({"step": step, **metrics})
        self.logger.log(metrics, step)
        if bar is not None:
            bar.update(step - bar.n)
        if step % self.cfg.runner.log_interval == 0 or self.EVAL_KEY in metrics:
            line = self.console_line(metrics, step)
            if bar is not None:
                bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)

    # --- timeline ------------------------------------------------------------------------------------------------

    def gather_trace(self) -> dict[str, float]:
        """Collect every worker's spans of the step that just ended; returns its time/trace/* metrics."""
        spans = tracer.drain() + self.drain_worker_spans()
        step = max((s for s in spans if s[0] == "driver" and s[2] == "step"), key=lambda s: s[4], default=None)
        if step is None:
            return {}
        win = [s for s in spans if s[0] == "driver" and s[2] == self.TRACE_WINDOW and s[4] >= step[4]]
        if self.global_step <= self.TRACE_FILE_STEPS:
            self.trace_spans += spans
            self.last_step_window = (step[4], step[5])
            self.last_traced_step = self.global_step  # the step number metrics.jsonl logs it under
        return tracer.step_metrics(spans, step[4], step[5], window=(win[0][4], win[0][5]) if win else None)

    def drain_worker_spans(self) -> list:
        """Every worker's spans recorded since the last drain (one trace_drain call per group, waited for)."""
        futures = [group.trace_drain() for group in self.groups]
        return [s for f in futures for per_rank in f.wait() for s in per_rank]

    def write_trace(self) -> None:
        """trace.json (every traced step) and timeline.png (the last traced step) into the run folder."""
        tracer.write_chrome_trace(self.trace_spans, self.run_dir / "trace.json")
        t0, t1 = self.last_step_window
        last = [s for s in self.trace_spans if s[5] > t0 and s[4] < t1]
        tracer.write_timeline_png(last, self.run_dir / "timeline.png", step=self.last_traced_step,
                                  title=self.trace_title())

    # --- checkpoints ---------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Write checkpoints/global_step_N atomically: everything goes into a .tmp folder that is renamed last."""
        root = self.run_dir / "checkpoints"
        final = root / f"global_step_{self.global_step}"
        tmp = root / f".global_step_{self.global_step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._save_checkpoint(tmp)
        # every rank's global generators (python, numpy, torch): a resumed worker draws what it would have drawn
        torch.save({g.name: [_rng_to_plain(s) for s in g.get_rng_state().wait()] for g in self.groups},
                   tmp / "rng.pt")
        (tmp / "runner.json").write_text(json.dumps({"global_step": self.global_step} | self._runner_state()))
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)  # atomic on one filesystem: a checkpoint folder is complete or absent
        return final

    def load_checkpoint(self, folder: Path) -> None:
        if not (folder / "runner.json").is_file():
            raise FileNotFoundError(f"runner.resume_dir: {folder} is not a complete checkpoint (no runner.json)")
        state = json.loads((folder / "runner.json").read_text())
        self._load_checkpoint(folder, state)
        # a checkpoint from elsewhere runs no code (weights_only); one written before rng.pt existed resumes unseeded
        rng = torch.load(folder / "rng.pt", weights_only=True) if (folder / "rng.pt").is_file() else {}
        for group in self.groups:
            states = [_rng_from_plain(s) for s in rng.get(group.name, [])]
            for rank, s in enumerate(states[: group.world_size]):  # a different world size: new ranks unseeded
                group.execute_on(rank).set_rng_state(s).wait()
        self.global_step = state["global_step"]


def _rng_to_plain(state: dict) -> dict:
    """numpy's generator state holds an ndarray, which torch.load(weights_only=True) refuses: store it as a tensor."""
    name, keys, pos, has_gauss, gauss = state["numpy"]
    return state | {"numpy": (name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss)}


def _rng_from_plain(state: dict) -> dict:
    name, keys, pos, has_gauss, gauss = state["numpy"]
    return state | {"numpy": (name, keys.numpy().astype("uint32"), pos, has_gauss, gauss)}
