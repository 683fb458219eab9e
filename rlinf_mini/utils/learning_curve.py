"""The learning-curve figure every run leaves in its folder: eval success and eval return against the training step.

    plot_learning_curve(runner.history, run_dir / "learning_curve.png")

`history` is the runner's list of per-step metric dicts (the same rows as metrics.jsonl); rows without eval metrics are
skipped. Drawn with matplotlib's Agg backend (no display needed). Of a resumed run, only the steps after the resume.
"""

from __future__ import annotations

import math
from pathlib import Path


def plot_learning_curve(history: list[dict[str, float]], path: str | Path) -> Path | None:
    """Write the PNG; returns its path, or None when the history holds no evaluation."""
    rows = [h for h in history if "eval/success_once" in h]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in rows]
    fig, (ax_s, ax_r) = plt.subplots(1, 2, figsize=(9, 3.4))
    ax_s.plot(steps, [h["eval/success_once"] for h in rows], marker="o")
    ax_s.set(xlabel="training step", ylabel="eval success", ylim=(-0.05, 1.05), title="eval success_once")
    returns = [h.get("eval/return", math.nan) for h in rows]
    ax_r.plot(steps, returns, marker="o", color="tab:orange")
    ax_r.set(xlabel="training step", ylabel="eval return", title="eval return (mean per episode)")
    for ax in (ax_s, ax_r):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
