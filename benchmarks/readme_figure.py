"""The README's picture: a run's learning curve and one pipelined step's timeline, side by side, drawn from the run's
own files (metrics.jsonl and trace.json), not from its PNGs.

    python -m rlinf_mini.train --config configs/embodied.yaml       # the README's train command
    python -m benchmarks.readme_figure --run-dir results/embodied  # -> docs/img/readme.png

Left: eval/success_once against the training step (the rows of metrics.jsonl that hold an eval). Right: every worker
rank's spans during the last training step trace.json holds (the runner keeps the first TRACE_FILE_STEPS steps), one
row per rank: the env's steps and the rollout's inferences alternate across the two pipeline stages, then the actor
trains.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlinf_mini.scheduler.tracer import span_colours

# The driver's phases of a step (runners/embodied.py), drawn as labelled bands on its row.
PHASES = ("sync_weights", "generate_rollouts", "cal_adv_and_returns", "actor_training")
LABELS = {"generate_rollouts": "rollout", "actor_training": "actor training"}
# Span names drawn as solid bars; every other work span is the pale band of a top-level call, and "wait*" a grey line.
WORK = ("env_step", "inference", "forward_backward", "optimizer_step", "grad_all_reduce", "weight_send", "weight_load")


def eval_curve(metrics: Path) -> tuple[list[int], list[float]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "eval/success_once" in r]
    return [r["step"] for r in rows], [r["eval/success_once"] for r in rows]


def last_step_events(trace: Path) -> tuple[list[dict], dict[tuple[int, int], str], float]:
    """The "X" events inside the driver's last `step` span, the row names ((pid, tid) -> "Group:rank"), and the
    step's start (us), which becomes time 0."""
    events = json.loads(trace.read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    steps = [
        e for e in events if e.get("ph") == "X" and e["name"] == "step" and names[(e["pid"], e["tid"])] == "driver:0"
    ]
    if not steps:
        raise SystemExit(f"error: {trace}: no driver step span (run with runner.trace: true)")
    last = max(steps, key=lambda e: e["ts"])
    t0, t1 = last["ts"], last["ts"] + last["dur"]
    inside = [e for e in events if e.get("ph") == "X" and e["ts"] < t1 and e["ts"] + e["dur"] > t0]
    return inside, names, t0


def draw(run_dir: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, success = eval_curve(run_dir / "metrics.jsonl")
    events, names, t0 = last_step_events(run_dir / "trace.json")
    fig, (ax_c, ax_t) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.9]})
    ax_c.plot(steps, success, marker="o")
    ax_c.set(
        xlabel="training step",
        ylabel="eval success (64 greedy episodes)",
        ylim=(-0.03, 1.03),
        title="learning curve: configs/embodied.yaml",
    )
    ax_c.grid(alpha=0.3)

    rows = sorted({(e["pid"], e["tid"]) for e in events})  # the driver first (pid 0), then each group by rank
    row_of = {r: i for i, r in enumerate(rows)}
    colour = span_colours(list(WORK))
    events_end = max(e["ts"] + e["dur"] for e in events)
    phase_colour = dict(zip(PHASES, ("#d9d2e9", "#fde3c8", "#d5e8d4", "#dae8fc"), strict=True))
    for e in sorted(events, key=lambda e: (e["name"] in PHASES, e["name"] in WORK)):  # bands first, work bars on top
        y, x, w = row_of[(e["pid"], e["tid"])], (e["ts"] - t0) / 1e3, e["dur"] / 1e3  # ms
        if e["name"].startswith("wait"):
            ax_t.broken_barh([(x, w)], (y - 0.05, 0.1), facecolors="0.6")
        elif e["name"] in PHASES and names[(e["pid"], e["tid"])] == "driver:0":
            ax_t.broken_barh([(x, w)], (y - 0.42, 0.84), facecolors=phase_colour[e["name"]], edgecolor="white")
            if e["name"] in LABELS and w > 0.08 * (events_end - t0) / 1e3:  # room for the label
                ax_t.text(x + w / 2, y, LABELS[e["name"]], ha="center", va="center", fontsize=8)
        elif e["name"] in WORK:
            stage = e.get("args", {}).get("stage", 0)
            ax_t.broken_barh(
                [(x, w)], (y - 0.3, 0.6), facecolors=colour[e["name"]], alpha=1.0 - 0.45 * (stage % 2), edgecolor="none"
            )
        else:
            ax_t.broken_barh([(x, w)], (y - 0.42, 0.84), facecolors="0.85", alpha=0.5, edgecolor="none")
    ax_t.set_yticks(range(len(rows)), [names[r] for r in rows])
    ax_t.invert_yaxis()
    ax_t.set_xlim(left=0)
    ax_t.set(xlabel="time in the step (ms)", title="one training step, every worker rank (trace.json)")
    used = [n for n in WORK if any(e["name"] == n for e in events)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in used] + [plt.Rectangle((0, 0), 1, 1, color="0.6")]
    ax_t.legend(handles, [*used, "wait"], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("results/embodied"))
    parser.add_argument("--out", type=Path, default=Path("docs/img/readme.png"))
    args = parser.parse_args(argv)
    missing = [p for p in ("metrics.jsonl", "trace.json") if not (args.run_dir / p).is_file()]
    if missing:
        raise SystemExit(f"error: {args.run_dir}: no {', '.join(missing)} (run the train command to its end first)")
    print(draw(args.run_dir, args.out))


if __name__ == "__main__":
    main()
