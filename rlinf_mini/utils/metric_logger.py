"""Metrics: one dict per step to a JSONL file, TensorBoard (optional) and the console.

RLinf counterpart: `rlinf/utils/metric_logger.py::MetricLogger` (tensorboard / wandb / swanlab backends).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlinf_mini.config import LoggerConfig

# The console line shows these, when present, in this order.
CONSOLE_KEYS = ("env/return", "env/success_once", "eval/success_once", "eval/return", "train/actor/approx_kl",
                "train/critic/value_loss", "time/step")


class MetricLogger:
    def __init__(self, cfg: LoggerConfig, run_dir: Path, resume_step: int = 0):
        self.path = run_dir / "metrics.jsonl"
        if resume_step == 0:
            self.path.write_text("")
        else:  # a resumed run continues the file from its checkpoint: later lines belonged to the lost future
            # (a run resumed from another run's checkpoint, into a folder of its own, starts a new file)
            old = self.path.read_text() if self.path.exists() else ""
            lines = [ln for ln in old.splitlines() if ln and json.loads(ln)["step"] <= resume_step]
            self.path.write_text("".join(ln + "\n" for ln in lines))
        self._file = self.path.open("a")
        self._tb = None
        if "tensorboard" in cfg.logger_backends:
            from torch.utils.tensorboard import SummaryWriter  # imported only when asked for: a slow import

            self._tb = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in sorted(metrics.items())}
        self._file.write(json.dumps({"step": step, **clean}, allow_nan=True) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if not math.isnan(v):
                    self._tb.add_scalar(k, v, step)

    @staticmethod
    def console_line(metrics: dict[str, float], step: int) -> str:
        parts = [f"step {step}"]
        for k in CONSOLE_KEYS:
            if k in metrics and not math.isnan(metrics[k]):
                parts.append(f"{k.split('/', 1)[0]}/{k.rsplit('/', 1)[-1]} {metrics[k]:.3g}")
        return " | ".join(parts)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict]:
    """The lines of a metrics.jsonl file, as dicts."""
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln]
