"""The timeline tracer (scheduler/tracer.py), its files and metrics, and the benchmarks in their tiny mode."""

from __future__ import annotations

import gc
import json
import math

import pytest
import torch
from conftest import write_config
from PIL import Image

from rlinf_mini.scheduler import codec as C
from rlinf_mini.scheduler import tracer


@pytest.fixture
def tracing(monkeypatch):
    monkeypatch.setenv("RLINF_MINI_GROUP", "EnvGroup")
    monkeypatch.setenv("RANK", "3")
    tracer.drain()
    tracer.enable()
    yield
    tracer.enable(False)
    tracer.drain()


def test_spans_are_well_formed_nested_and_named_by_group_and_rank(tracing):
    with tracer.span("interact"):
        for k in range(2):
            with tracer.span("wait_actions", stage=k):
                pass
            with tracer.span("env_step", stage=k):
                sum(range(1000))
    spans = tracer.drain()
    assert tracer.drain() == []  # drained once
    assert [s[2] for s in spans] == ["wait_actions", "env_step", "wait_actions", "env_step", "interact"]
    assert {(s[0], s[1]) for s in spans} == {("EnvGroup", 3)}
    assert [s[3] for s in spans] == [0, 0, 1, 1, -1]
    outer = spans[-1]
    for _, _, _, _, start, end in spans:
        assert start <= end
        assert outer[4] <= start and end <= outer[5]  # children inside their parent
    for a, b in zip(spans[:-2], spans[1:-1], strict=True):
        assert a[5] <= b[4]  # siblings in order, not overlapping


def test_a_span_whose_block_raises_is_recorded_and_the_exception_goes_on(tracing):
    with pytest.raises(KeyError, match="boom"), tracer.span("env_step", stage=1):
        raise KeyError("boom")
    (span,) = tracer.drain()
    assert span[:4] == ("EnvGroup", 3, "env_step", 1) and span[4] <= span[5]


def test_disabled_tracer_records_nothing():
    tracer.drain()  # what an earlier in-process run of this pytest worker left unread
    tracer.enable(False)
    with tracer.span("x"):
        pass
    assert tracer.drain() == []


def test_busy_and_bubble_metrics_against_hand_computed_values():
    ms = 1_000_000
    spans = [
        ("EnvGroup", 0, "interact", -1, 0, 100 * ms),
        ("EnvGroup", 0, "wait_actions", 0, 10 * ms, 40 * ms),  # 30 ms waiting inside the call
        ("EnvGroup", 0, "env_step", 0, 40 * ms, 60 * ms),
        ("RolloutGroup", 0, "generate", -1, 0, 50 * ms),
        ("RolloutGroup", 0, "wait_obs", 0, 0, 10 * ms),
        ("ActorGroup", 0, "run_training", -1, 100 * ms, 200 * ms),  # outside the window: clipped away
        ("ActorGroup", 1, "run_training", -1, 0, 100 * ms),
        ("driver", 0, "step", -1, 0, 100 * ms),
    ]
    m = tracer.step_metrics(spans, 0, 100 * ms, window=(0, 100 * ms))
    assert m["time/trace/busy/EnvGroup"] == pytest.approx(0.7)  # 100 - 30 waiting
    assert m["time/trace/busy/RolloutGroup"] == pytest.approx(0.4)  # 50 - 10 waiting
    assert m["time/trace/busy/ActorGroup"] == pytest.approx(0.5)  # ranks 0 and 1: 0.0 and 1.0
    assert m["time/trace/idle/EnvGroup"] == pytest.approx(0.3)
    assert m["time/trace/bubble/env_waits"] == pytest.approx(0.3)
    assert m["time/trace/bubble/rollout_waits"] == pytest.approx(0.1)
    assert not any("driver" in k for k in m)


def _example_spans():
    ms = 1_000_000
    return [("driver", 0, "step", -1, 0, 90 * ms), ("EnvGroup", 0, "interact", -1, 1 * ms, 80 * ms),
            ("EnvGroup", 0, "env_step", 0, 2 * ms, 10 * ms), ("EnvGroup", 0, "env_step", 1, 12 * ms, 20 * ms),
            ("RolloutGroup", 0, "inference", 1, 2 * ms, 9 * ms), ("RolloutGroup", 0, "wait_obs", 0, 9 * ms, 12 * ms),
            ("ActorGroup", 1, "optimizer_step", -1, 50 * ms, 60 * ms)]


def test_chrome_trace_loads_with_expected_events(tmp_path):
    spans = _example_spans()
    path = tracer.write_chrome_trace(spans, tmp_path / "trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert sorted(e["name"] for e in complete) == sorted(s[2] for s in spans)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert set(names.values()) == {"driver", "EnvGroup", "RolloutGroup", "ActorGroup"}
    for e in complete:
        assert e["ts"] >= 0 and e["dur"] >= 0
    step = next(e for e in complete if e["name"] == "env_step" and e["args"]["stage"] == 1)
    assert names[step["pid"]] == "EnvGroup" and step["tid"] == 0
    assert step["ts"] == pytest.approx(12_000) and step["dur"] == pytest.approx(8_000)  # microseconds
    opt = next(e for e in complete if e["name"] == "optimizer_step")
    assert names[opt["pid"]] == "ActorGroup" and opt["tid"] == 1


def test_timeline_png_has_one_row_per_rank_and_opens(tmp_path):
    path = tracer.write_timeline_png(_example_spans(), tmp_path / "timeline.png", title="test", step=7)
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        w, h = img.size
        assert img.text["Title"] == "training step 7: test"  # the title drawn above the chart
    assert 800 <= w <= 3000 and 150 <= h <= 2000


def test_received_shm_tensor_holds_its_segment_until_freed():
    t = torch.arange(300_000, dtype=torch.float32)  # 1.2 MB: a size class no other test uses
    a = C.loads(C.dumps(t))
    n = len(C._send_pool.segments)
    b = C.loads(C.dumps(t))  # `a` still uses its segment (zero copy): a second one is needed
    assert len(C._send_pool.segments) == n + 1
    view = a[10:20]  # a view keeps the segment too
    del a
    gc.collect()
    c = C.loads(C.dumps(t))
    assert len(C._send_pool.segments) == n + 2
    assert torch.equal(view, t[10:20]) and torch.equal(b, t) and torch.equal(c, t)
    del view, b, c
    gc.collect()
    for _ in range(5):
        assert torch.equal(C.loads(C.dumps(t)), t)  # every segment free again: reused, none added
    assert len(C._send_pool.segments) == n + 2


def test_training_run_writes_trace_timeline_and_trace_metrics(tmp_path):
    from rlinf_mini.train import main

    cfg = write_config(tmp_path, runner={"max_epochs": 2, "val_check_interval": -1, "save_interval": -1,
                                         "progress_bar": False, "trace": True})
    assert main(["--config", str(cfg)]) == 0
    run_dir = tmp_path / "results" / "embodied"
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "X"}
    for expected in ("env_step", "inference", "wait_actions", "wait_obs", "weight_send", "wait_weights",
                     "forward_backward", "optimizer_step", "compute_advantages_and_returns", "generate_rollouts"):
        assert expected in names
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"EnvGroup:0", "RolloutGroup:0", "ActorGroup:0", "ActorGroup:1"} <= threads
    with Image.open(run_dir / "timeline.png") as img:
        assert img.size[0] >= 800
        assert img.text["Title"].startswith("training step 2: ")  # the last traced step, as metrics.jsonl numbers it
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    for group in ("EnvGroup", "RolloutGroup", "ActorGroup"):
        assert 0.0 < last[f"time/trace/busy/{group}"] <= 1.0
        assert last[f"time/trace/busy/{group}"] + last[f"time/trace/idle/{group}"] == pytest.approx(1.0)
    assert 0.0 <= last["time/trace/bubble/env_waits"] <= 1.0 and 0.0 <= last["time/trace/bubble/rollout_waits"] <= 1.0


def test_benchmarks_tiny_mode_writes_every_row(tmp_path):
    from benchmarks.__main__ import main

    out = tmp_path / "bench.json"
    assert main(["--tiny", "--only", "channel,weights,all_reduce,pipeline", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["rows"]}
    pipe = "pipeline hybrid, stage_num 2, E=2 ms, P=2 ms"
    whole = "whole step: hybrid, stage_num 2 vs collocated, stage_num 1 (E=2 ms, P=1 ms per call)"
    assert {"channel, large (64x3x64x64 uint8, 786 KB)", "channel, small (dict of 4 scalars)",
            "weight sync, 1M float32 (4 MB)", "local: all-reduce of 80000 float32, 2 ranks", pipe, whole} <= set(rows)
    for r in rows.values():
        assert r["ours"] > 0 and math.isfinite(r["ours"])
        if r["ratio"] is not None:
            assert r["ratio"] > 0
        if r["target"]:
            assert r["met"] in (True, False)
        assert len(r["reps"]) == report["repetitions"] == 1  # every repetition is kept
    # the latency knobs are waits, so they bound the time from below: the pipeline's baseline (stage_num 1) waited
    # 3 env steps of E = 2 ms and 4 inferences of P = 2 ms (the 4th: the bootstrap value) per rollout
    assert rows[pipe]["baseline"] <= 3 / (3 * 0.002 + 4 * 0.002)
    assert [e["group"] for e in report["load"]] == ["channel", "channel", "weights", "weights", "all_reduce",
                                                    "all_reduce", "pipeline", "pipeline"]
    assert all(len(e["loadavg"]) == 3 for e in report["load"])
    assert (tmp_path / "pipeline_stage2_timeline.png").is_file()
    assert main(["--only", "nonsense", "--out", str(out)]) == 2


def test_a_benchmark_row_is_the_median_of_its_repetitions_and_shows_their_spread():
    from benchmarks.measure import Row
    from benchmarks.table import format_table

    reps = [{"ours": o, "baseline": 10.0, "limit": 20.0, "ratio": o / 20.0} for o in (19.0, 12.0, 15.0)]
    row = Row.from_reps("x", "GB/s", reps, baseline_name="b", limit_name="memcpy", ratio_of="ours/limit",
                        target=">= 0.7")
    assert (row.ours, row.baseline, row.limit, row.ratio) == (15.0, 10.0, 20.0, 0.75)
    assert row.spread == (0.6, 0.95) and row.met is True and row.reps == reps
    assert "0.75 [0.6-0.95] ours/limit" in format_table([row], markdown=False)
    assert Row.from_reps("y", "us", reps[:1], ratio_of="ours").spread is None  # one repetition: no range


def test_benchmarks_tiny_mode_group_calls_and_the_runner_against_both_plain_loops(tmp_path):
    from benchmarks.__main__ import main

    out = tmp_path / "bench.json"
    assert main(["--tiny", "--only", "group_call,runner", "--out", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    calls = [rows[f"group call round trip, no-op on {n}"] for n in ("1 rank", "4 ranks")]
    assert all(0 < r["ours"] < 1e6 for r in calls)  # microseconds, finite
    same, one = rows["end to end (embodied_mlp): runner rollout env steps/s"], \
        rows["end to end (embodied_mlp): vs a loop over one batch"]
    assert same["ours"] == one["ours"] > 0  # one runner figure, two baselines
    assert "same calls (2 x 16 envs)" in same["baseline_name"] and "1 x 32 envs" in one["baseline_name"]
    assert same["ratio"] == pytest.approx(same["ours"] / same["baseline"])
    assert rows["tracing overhead (embodied_mlp): step time, trace on / off"]["ratio"] > 0


@pytest.mark.parametrize("n_calls", [40, 80])  # within the tab20/b/c palette, and past it
def test_every_span_name_of_a_timeline_gets_its_own_colour(n_calls):
    names = [f"call_{i}" for i in range(n_calls)] + ["env_step", "inference", "weight_send", "weight_load"]
    colours = tracer.span_colours(names)
    assert len(set(colours.values())) == len(names)  # N names, N colours
    assert all(len(set(c[:3])) > 1 for c in colours.values())  # no grey: grey is a wait
