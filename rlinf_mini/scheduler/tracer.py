"""Timeline tracer: every process records spans (what it did, from when to when); the runner gathers them into a
Chrome trace, a Gantt chart and per-step busy / idle / bubble metrics.

    from rlinf_mini.scheduler.tracer import span
    with span("env_step", stage=k):          # in a worker: one line around the work (a no-op when tracing is off)
        ...
    spans = drain()                           # the runner collects each worker's spans once per step
    write_chrome_trace(spans, run_dir / "trace.json")     # chrome://tracing or https://ui.perfetto.dev
    write_timeline_png(spans, run_dir / "timeline.png")   # one row per worker rank
    step_metrics(spans, t0, t1)                           # time/trace/busy/<component>, ...

A span is a plain tuple (component, rank, name, stage, start_ns, end_ns), appended to a list in the process that
recorded it: two clock reads and one append, about 1 us. The clock is CLOCK_MONOTONIC (`time.monotonic_ns`), one
clock for every process of the machine, so spans of different workers line up on one time axis.

Names that start with "wait" (channel gets/puts that block, weight-version waits) are idle time; everything else is
work. The pipeline bubble of a step is the time the env waits for actions plus the time the rollout waits for
observations, each as a fraction of the generate_rollouts phase.

RLinf counterpart: none in this form (RLinf has per-phase timers and an optional torch profiler window; its users
have asked where the pipeline waits). Left out: GPU kernel timelines (use the torch profiler for those).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

Span = tuple[str, int, str, int, int, int]  # (component, rank, name, stage (-1: none), start_ns, end_ns)

_spans: list[Span] = []
_enabled = False
_who = ("driver", 0)  # (component, rank) of this process; workers set it from their environment


def enable(on: bool = True) -> None:
    """Turn recording on or off in this process. Workers name themselves by their group and rank."""
    global _enabled, _who
    _enabled = on
    group = os.environ.get("RLINF_MINI_GROUP")  # set in every worker process; absent in the driver
    _who = (group, int(os.environ.get("RANK", "0"))) if group else ("driver", 0)


_thread = threading.local()  # inline backend: each rank is a thread of the driver and names itself here


def set_thread_identity(component: str, rank: int) -> None:
    """Spans recorded by this thread belong to (component, rank) (the inline backend's rank threads)."""
    _thread.who = (component, rank)


def enabled() -> bool:
    return _enabled


class _Span:
    """One span being recorded: the clock is read on entry and on exit, and the exit appends the record."""

    __slots__ = ("name", "stage", "component", "start")

    def __init__(self, name: str, stage: int, component: str | None):
        self.name, self.stage, self.component = name, stage, component

    def __enter__(self) -> None:
        self.start = time.monotonic_ns()

    def __exit__(self, *exc) -> bool:
        end = time.monotonic_ns()
        who = getattr(_thread, "who", _who)
        _spans.append((self.component or who[0], who[1], self.name, self.stage, self.start, end))
        return False  # an exception in the block goes on, after its span is recorded


class _NoSpan:
    """What `span` returns while tracing is off: one shared object whose enter and exit do nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return False


_NO_SPAN = _NoSpan()


def span(name: str, stage: int = -1, component: str | None = None) -> _Span | _NoSpan:
    """Record the time spent in the `with` block as span `name` (a no-op when tracing is off). A class, not a
    generator-based context manager: it runs around every channel wait and every inference, traced or not."""
    return _Span(name, stage, component) if _enabled else _NO_SPAN


def record(name: str, start_ns: int, end_ns: int) -> None:
    """Record a span measured elsewhere (a wait only known to have happened once it is over: a Ray channel call)."""
    if _enabled:
        who = getattr(_thread, "who", _who)
        _spans.append((who[0], who[1], name, -1, start_ns, end_ns))


def drain() -> list[Span]:
    """Hand over and forget the spans recorded so far in this process."""
    global _spans
    out, _spans = _spans, []
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Busy / idle / bubble


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


def _clip(intervals: list[tuple[int, int]], t0: int, t1: int) -> list[tuple[int, int]]:
    return [(max(s, t0), min(e, t1)) for s, e in intervals if e > t0 and s < t1]


def busy_ns(spans: list[Span], t0: int, t1: int) -> int:
    """Time in [t0, t1] covered by work spans and not by wait spans (spans nest: a call holds its waits)."""
    work = _union(_clip([(s[4], s[5]) for s in spans if not s[2].startswith("wait")], t0, t1))
    waits = _union(_clip([(s[4], s[5]) for s in spans if s[2].startswith("wait")], t0, t1))
    overlap = 0
    for ws, we in waits:  # wait time inside work time is not work
        for s, e in work:
            overlap += max(0, min(we, e) - max(ws, s))
    return _length(work) - overlap


def step_metrics(spans: list[Span], t0: int, t1: int, window: tuple[int, int] | None = None) -> dict[str, float]:
    """Per component: busy fraction of [t0, t1] (mean over its ranks); the pipeline bubble within `window`
    (the generate_rollouts phase): env waiting for actions and rollout waiting for observations, as fractions."""
    out: dict[str, float] = {}
    ranks: dict[tuple[str, int], list[Span]] = {}
    for s in spans:
        ranks.setdefault((s[0], s[1]), []).append(s)
    per_component: dict[str, list[float]] = {}
    for (component, _), own in ranks.items():
        if component == "driver":
            continue
        per_component.setdefault(component, []).append(busy_ns(own, t0, t1) / max(1, t1 - t0))
    for component, fracs in sorted(per_component.items()):
        busy = sum(fracs) / len(fracs)
        out[f"time/trace/busy/{component}"] = busy
        out[f"time/trace/idle/{component}"] = 1.0 - busy
    if window is not None:
        w0, w1 = window
        for who, wait_name in (("env", "wait_actions"), ("rollout", "wait_obs")):
            per_rank = [_length(_union(_clip([(s[4], s[5]) for s in own if s[2] == wait_name], w0, w1)))
                        for own in ranks.values() if any(s[2] == wait_name for s in own)]
            if per_rank:
                out[f"time/trace/bubble/{who}_waits"] = sum(per_rank) / len(per_rank) / max(1, w1 - w0)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Files


def _rows(spans: list[Span]) -> list[tuple[str, int]]:
    """Timeline rows: the driver first, then each component's ranks, in the order components first appear."""
    order: dict[str, int] = {}
    for s in sorted(spans, key=lambda s: s[4]):
        order.setdefault(s[0], len(order))
    rows = sorted({(s[0], s[1]) for s in spans}, key=lambda r: (r[0] != "driver", order[r[0]], r[1]))
    return rows


def write_chrome_trace(spans: list[Span], path: Path) -> Path:
    """Chrome trace event format ("X" complete events, microseconds): one process per component, one thread per
    rank. Opens in chrome://tracing and in Perfetto."""
    rows = _rows(spans)
    pids = {c: i for i, c in enumerate(dict.fromkeys(c for c, _ in rows))}
    t_base = min((s[4] for s in spans), default=0)
    events: list[dict] = []
    for component, pid in pids.items():
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": component}})
    for component, rank in rows:
        events.append({"name": "thread_name", "ph": "M", "pid": pids[component], "tid": rank,
                       "args": {"name": f"{component}:{rank}"}})
    for component, rank, name, stage, start, end in sorted(spans, key=lambda s: (s[4], -s[5])):
        ev = {"name": name, "cat": "wait" if name.startswith("wait") else "work", "ph": "X",
              "ts": (start - t_base) / 1e3, "dur": (end - start) / 1e3, "pid": pids[component], "tid": rank}
        if stage >= 0:
            ev["args"] = {"stage": stage}
        events.append(ev)
    path = Path(path)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path


def _depths(spans: list[Span]) -> list[int]:
    """Nesting depth of each span within its row (0: a top-level call), by a stack over start times."""
    depth = [0] * len(spans)
    stacks: dict[tuple[str, int], list[int]] = {}
    for i in sorted(range(len(spans)), key=lambda i: (spans[i][4], -spans[i][5])):
        stack = stacks.setdefault((spans[i][0], spans[i][1]), [])
        while stack and spans[stack[-1]][5] <= spans[i][4]:
            stack.pop()
        depth[i] = len(stack)
        stack.append(i)
    return depth


_COLOURS = {"env_step": "tab:blue", "inference": "tab:orange", "forward_backward": "tab:green",
            "optimizer_step": "tab:red", "weight_send": "tab:purple", "weight_load": "tab:pink"}


def span_colours(names: list[str]) -> dict[str, tuple]:
    """A distinct colour for every span name: the fixed ones above, then the next unused colour of tab20, tab20b
    and tab20c (greys left out: grey means waiting), then, past those ~50, evenly spaced hues (never repeated)."""
    from matplotlib import colormaps
    from matplotlib import colors as mcolors

    fixed = {n: mcolors.to_rgba(c) for n, c in _COLOURS.items()}
    palette = [mcolors.to_rgba(c) for cmap in ("tab20", "tab20b", "tab20c") for c in colormaps[cmap].colors
               if len(set(c[:3])) > 1 and mcolors.to_rgba(c) not in fixed.values()]  # a grey has r = g = b
    extra = len(names) - len(palette)  # more names than the palette holds: one hue each, around the colour wheel
    palette += [mcolors.to_rgba(mcolors.hsv_to_rgb((i / extra, 0.75, 0.8))) for i in range(max(0, extra))]
    out, free = {}, iter(palette)
    for name in names:
        out[name] = fixed.get(name) or next(free)
    return out


def write_timeline_png(spans: list[Span], path: Path, title: str = "", step: int | None = None) -> Path:
    """A Gantt chart: one row per worker rank. Top-level calls are pale bands, the work inside them solid colours
    (a later pipeline stage a lighter shade, each span name its own colour), waits thin grey bars. `step`, the
    training step the spans belong to, opens the title."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    rows = _rows(spans)
    row_of = {r: i for i, r in enumerate(rows)}
    t_base = min((s[4] for s in spans), default=0)
    depth = _depths(spans)
    names = sorted({s[2] for s in spans if not s[2].startswith("wait")})
    colour = span_colours(names)
    fig, ax = plt.subplots(figsize=(14, 1.2 + 0.55 * max(1, len(rows))), dpi=100)
    for i in sorted(range(len(spans)), key=lambda i: depth[i]):  # parents first, nested spans on top
        component, rank, name, stage, start, end = spans[i]
        y = row_of[(component, rank)]
        x, w = (start - t_base) / 1e6, (end - start) / 1e6  # ms
        if name.startswith("wait"):
            ax.broken_barh([(x, w)], (y - 0.06, 0.12), facecolors="0.6")
        elif depth[i] == 0:
            ax.broken_barh([(x, w)], (y - 0.42, 0.84), facecolors=colour[name], alpha=0.35, edgecolor="none")
        else:
            alpha = 1.0 if stage < 0 else 1.0 - 0.4 * (stage % 2)
            ax.broken_barh([(x, w)], (y - 0.3, 0.6), facecolors=colour[name], alpha=alpha, edgecolor="none")
    ax.set_yticks(range(len(rows)), [f"{c}:{r}" for c, r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in names]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="0.6"))
    ax.legend(handles, [*names, "wait"], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    head = f"training step {step}" if step is not None else "timeline"
    title = f"{head}: {title}" if title else head
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, metadata={"Title": title})  # also in the PNG's text chunk, where a program can read it
    plt.close(fig)
    return path
