"""The pipeline rows and the whole-step row, on the real runner: configs/embodied_mlp.yaml's EnvWorker, RolloutWorker
(stages/rollout.py) and ActorWorker, started by `rlinf_mini.train.launch`, one training step per round through
`EmbodiedRunner.run`; the pipeline rows read the runner's `time/generate_rollouts`, the whole-step row its `time/step`
(sync, rollout, advantages, training).

The work per call is set by the two latency knobs, both waits (the process sleeps, its core stays free):
`env.train.step_latency_s` (a simulator) and `rollout.policy_latency_s` (a policy on a GPU or a server). A `Case`
says what a full batch of all envs costs and how that cost splits over S pipeline stages; every case but `ranks2` has
one env rank and one rollout rank, so the placements differ only in which devices (here: cores) the processes share.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

CONFIG = "configs/embodied_mlp.yaml"
NUM_ENVS = 32  # the config's env.train.total_num_envs

# name -> (cluster.num_devices, component_placement); one env rank and one rollout rank in each
PLACEMENTS = {
    "collocated": (2, {"env,rollout,actor": "0-1:0"}),  # one process each, every process on both devices
    "disaggregated": (3, {"env": "0", "rollout": "1", "actor": "2"}),  # 3 devices on 2 cores: actor shares core 0
    "hybrid": (2, {"env": "0", "rollout": "1", "actor": "0-1"}),  # the shipped config's placement
    "ranks2": (2, {"env,rollout,actor": "0-1"}),  # RLinf's collocated on 2 devices: 2 ranks of each, one per device
}


@dataclass(frozen=True)
class Case:
    placement: str  # a key of PLACEMENTS
    stage_num: int
    env_s: float  # one chunk step of all envs; a stage (1/S of the envs) waits env_s / S: a simulator's cost per env
    policy_s: float  # one inference over all envs (/ S per stage), or over any batch when `per_call`
    per_call: bool = False  # a large model at a small batch: its time is reading the weights, the same for any batch

    @property
    def latencies(self) -> tuple[float, float]:
        """(step_latency_s, policy_latency_s) of one call, on one stage's envs."""
        return self.env_s / self.stage_num, self.policy_s if self.per_call else self.policy_s / self.stage_num

    @property
    def tag(self) -> str:
        return f"{self.placement[:5]}{self.stage_num}{'v' if self.per_call else ''}"

    def ideal_step_s(self) -> float:
        """A chunk step's time if every wait of the env overlapped every wait of the policy but one stage's."""
        env, policy = self.latencies
        if self.stage_num == 1:
            return env + policy
        return self.stage_num * max(env, policy)


def _config(case: Case, n_steps: int, log_path: str, config: str = CONFIG, num_envs: int = NUM_ENVS):
    from rlinf_mini.config import load_config

    env, policy = case.latencies
    cfg = load_config(["--config", config, "--runner.logger.log_path", log_path,
                       "--runner.logger.experiment-name", case.tag,
                       "--runner.no-progress-bar", "--runner.no-trace", "--runner.log-interval", "1000",
                       "--runner.val-check-interval", "-1", "--runner.save-interval", "-1",
                       "--rollout.pipeline-stage-num", str(case.stage_num),
                       "--env.train.max-steps-per-rollout-epoch", str(n_steps),
                       "--actor.global-batch-size", str(num_envs * n_steps),
                       "--actor.micro-batch-size", str(num_envs * n_steps // 2),
                       "--env.train.step-latency-s", repr(env), "--rollout.policy-latency-s", repr(policy)])
    num_devices, placement = PLACEMENTS[case.placement]
    names = {"env": f"Env{case.tag}", "rollout": f"Rollout{case.tag}", "actor": f"Actor{case.tag}"}  # one cluster
    logger = dataclasses.replace(cfg.runner.logger, logger_backends=[])  # metrics.jsonl only
    return dataclasses.replace(
        cfg, runner=dataclasses.replace(cfg.runner, logger=logger),
        cluster=dataclasses.replace(cfg.cluster, num_devices=num_devices, component_placement=placement),
        env=dataclasses.replace(cfg.env, group_name=names["env"]),
        rollout=dataclasses.replace(cfg.rollout, group_name=names["rollout"]),
        actor=dataclasses.replace(cfg.actor, group_name=names["actor"]))


def measure(cases: list, n_steps: int, reps: int, trace: Case | None = None, config: str = CONFIG,
            num_envs: int = NUM_ENVS, make_config=None) -> tuple[dict, list]:
    """Start one runner per case in one cluster, warm each up with one training step, then run `reps` rounds of one
    step each, the cases in turn within a round (so a busy machine slows every case alike). Returns, per case, each
    round's {"generate_s", "step_s"} (the runner's own timers), and the spans of `trace`'s last round (env and
    rollout workers). `make_config(case, log_path)`, when given, makes each case's config (a case then needs only a
    `tag` and to be hashable; benchmarks/autotune_check.py measures the autotune's layouts so)."""
    from rlinf_mini.scheduler.cluster import Cluster
    from rlinf_mini.train import RunPlan, launch

    times: dict[Case, list[dict]] = {c: [] for c in cases}
    spans: list = []
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as log_path:
        cfgs = {c: make_config(c, log_path) if make_config else _config(c, n_steps, log_path, config, num_envs)
                for c in cases}
        devices = {cfg.cluster.num_devices for cfg in cfgs.values()}
        assert len(devices) == 1, f"one cluster, one device count: {devices}"
        cluster = Cluster(next(iter(cfgs.values())).cluster)
        try:
            runners = {}
            for c, cfg in cfgs.items():  # the processes of every runner start together
                plan = RunPlan(cfg, f"{config} ({c.tag})")
                plan.run_dir.mkdir(parents=True)
                runners[c] = launch(cfg, plan, cluster)
            for runner in runners.values():
                runner.init_workers()
            if trace is not None:
                for g in (runners[trace].env, runners[trace].rollout):
                    g.trace_enable().wait()
            for rnd in range(reps + 1):  # round 0 is the warm-up: first calls, first-touch page faults
                for c, runner in runners.items():
                    if c == trace:
                        runner.env.trace_drain().wait()
                        runner.rollout.trace_drain().wait()
                    runner.max_steps = runner.global_step + 1
                    last = runner.run()[-1]
                    t = {"generate_s": last["time/generate_rollouts"], "step_s": last["time/step"]}
                    if rnd > 0:
                        times[c].append(t)
                    if c == trace and rnd == reps:
                        spans = [s for g in (runner.env, runner.rollout) for per_rank in g.trace_drain().wait()
                                 for s in per_rank]
        finally:
            cluster.shutdown()
    return times, spans


def pipeline_rows(cases: list[Case], times: dict[Case, list[dict]], n_steps: int, row_cls, target_case: Case | None,
                  png: Path | None) -> list:
    """One row per case with stage_num > 1: its rollout's speedup over the case with stage_num 1 (same placement and
    latencies), per round, divided by the ideal speedup; the row's figures are medians over the rounds."""
    rows = []
    for c in cases:
        base = next((b for b in cases if (b.placement, b.env_s, b.policy_s, b.per_call, b.stage_num)
                     == (c.placement, c.env_s, c.policy_s, c.per_call, 1)), None)
        if c.stage_num == 1 or base is None:
            continue
        ideal = base.ideal_step_s() / c.ideal_step_s()
        reps = []
        for t, t1 in zip(times[c], times[base], strict=True):
            ours, baseline = n_steps / t["generate_s"], n_steps / t1["generate_s"]
            reps.append({"ours": ours, "baseline": baseline, "limit": baseline * ideal,
                         "ratio": ours / baseline / ideal})
        env, policy = c.env_s * 1e3, c.policy_s * 1e3
        lat = f"E={env:g} ms, P={policy:g} ms{' per call' if c.per_call else ''}"
        name = f"pipeline {c.placement}, stage_num {c.stage_num}, {lat}"
        note = f"ideal speedup {ideal:.2f}"
        if c == target_case and png is not None:
            note += f"; timeline: {png.name}"
        rows.append(row_cls.from_reps(name, "steps/s", reps, baseline_name="stage_num 1", limit_name="ideal",
                                      ratio_of="speedup/ideal", target=">= 0.9" if c == target_case else "",
                                      note=note))
    return rows


def whole_step_row(fast: Case, slow: Case, times: dict[Case, list[dict]], row_cls, env_steps: int):
    """`fast`'s whole training step against `slow`'s, round by round: the ratio is slow's step time / fast's."""
    reps = []
    for t, t0 in zip(times[fast], times[slow], strict=True):
        reps.append({"ours": env_steps / t["step_s"], "baseline": env_steps / t0["step_s"],
                     "ratio": t0["step_s"] / t["step_s"]})
    gen = statistics.median(t0["generate_s"] / t["generate_s"] for t, t0 in zip(times[fast], times[slow], strict=True))
    share = statistics.median(t["generate_s"] / t["step_s"] for t in times[slow])
    return row_cls.from_reps(
        f"whole step: hybrid, stage_num {fast.stage_num} vs collocated, stage_num {slow.stage_num} "
        f"(E={fast.env_s * 1e3:g} ms, P={fast.policy_s * 1e3:g} ms per call)", "env steps/s", reps,
        baseline_name="collocated, stage_num 1", ratio_of="speedup",
        note=f"RLinf-VLA: 1.61-1.88x; the rollout phase alone {gen:.2f}x (ideal "
             f"{slow.ideal_step_s() / fast.ideal_step_s():.2f}); rollout = {share:.0%} of the collocated step")
