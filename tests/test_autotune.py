"""The placement autotune (rlinf_mini/autotune/): the pipeline formula against an event-by-event simulation of the
env/rollout protocol, the search against a brute-force enumeration of every layout, the ranking, the named refusals,
RLinf's profile_data, the overlay the train command loads, and one-line errors. Fixed costs only: no test here
profiles or starts a process (the measured check is benchmarks/autotune_check.py)."""

import dataclasses
import itertools

import pytest

from rlinf_mini.autotune.__main__ import autotune, main, overlay, overrides, write_overlay
from rlinf_mini.autotune.model import Affine, Costs, Layout, Workload, cycle_terms, predict
from rlinf_mini.autotune.search import ACTOR_RULE, rank, rule_refusal, screen
from rlinf_mini.config import load_config
from rlinf_mini.explain import explain

CONFIG = "configs/embodied_mlp.yaml"
BIG = 2**50  # bytes: no memory refusal


def simulate_rollout(E: float, P: float, hop: float, stages: int, k: int, T: int) -> float:
    """The rollout phase, message by message: k env ranks (own devices) step their stages in turn; one rollout rank
    serves, per chunk step and stage, each env rank in turn; taking a message costs its receiver `hop`. Returns the
    time the last (bootstrap) inference ends."""
    obs = {(r, s, 0): 0.0 for r in range(k) for s in range(stages)}  # every stage's first obs, put at time 0
    env_free, rollout_free, actions = [0.0] * k, 0.0, {}
    for t in range(T + 1):
        for s in range(stages):
            for r in range(k):
                rollout_free = max(rollout_free, obs[(r, s, t)]) + hop + P
                actions[(r, s, t)] = rollout_free
        if t == T:
            return rollout_free
        for r in range(k):
            for s in range(stages):
                env_free[r] = max(env_free[r], actions[(r, s, t)]) + hop + E
                obs[(r, s, t + 1)] = env_free[r]
    raise AssertionError("unreachable")


@pytest.mark.parametrize("stages,k", [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (2, 3), (4, 3)])
def test_cycle_formula_matches_an_event_simulation(stages, k):
    T = 32
    for E, P, hop in itertools.product([0.5, 1.0, 4.0], [0.5, 1.0, 4.0], [0.0, 0.3]):
        e, p = E / stages, P / stages  # a cost per sub-env: each stage steps 1/S of them
        terms = cycle_terms(e, p, 0.0, 0.0, hop, stages, k, [(k, 0), (0, 1)])  # env and rollout on other devices
        formula = T * max(terms.values()) + stages * k * (p + hop)
        simulated = simulate_rollout(e, p, hop, stages, k, T)
        assert formula == pytest.approx(simulated, rel=0.1), (E, P, hop)  # the fill of the pipeline: a few %


def test_affine_fit_recovers_a_line_and_keeps_measured_points():
    fit = Affine.of({4: 0.5 + 4 * 0.25, 8: 0.5 + 8 * 0.25, 16: 0.5 + 16 * 0.25})
    a, b = fit.coefficients
    assert (a, b) == (pytest.approx(0.5), pytest.approx(0.25))
    assert fit(32) == pytest.approx(8.5)
    noisy = Affine.of({4: 1.0, 8: 3.0, 16: 4.0})
    assert noisy(8) == 3.0  # measured: as measured, not the fit's value


# --------------------------------------------------------------------------------------------------------------------
# The search on fixed costs, against brute force


def _cfg(num_devices: int):
    return load_config(["--config", CONFIG, f"cluster.num_devices={num_devices}", "actor.micro_batch_size=64"])


def _work(cfg) -> Workload:
    from rlinf_mini.autotune.__main__ import workload

    return workload(cfg)


REGIMES = {  # seconds at sub-envs per call: env-bound, policy-bound, balanced (compute: no waits)
    "env": (Affine.of({1: 0.0006, 32: 0.0068}), Affine.of({1: 0.0002, 32: 0.0005})),
    "policy": (Affine.of({1: 0.0002, 32: 0.0005}), Affine.of({1: 0.0006, 32: 0.0068})),
    "balanced": (Affine.of({1: 0.0004, 32: 0.0036}), Affine.of({1: 0.0004, 32: 0.0036})),
}


def _costs(regime: str, waits: bool) -> Costs:
    env, policy = REGIMES[regime]
    return Costs(env, policy, Affine.of({128: 0.02, 256: 0.03, 512: 0.05}), env_wait_s=0.0004 if waits else 0.0,
                 policy_wait_s=0.0004 if waits else 0.0, hop_s=0.0002, fixed_s=0.01, process_bytes=2**28,
                 weight_bytes=2**20, sample_bytes=64, subenv_bytes=2**16)


def _ranges(num_devices: int) -> list[tuple[int, ...]]:
    return [tuple(range(a, b)) for a in range(num_devices) for b in range(a + 1, num_devices + 1)]


@pytest.mark.parametrize("regime", sorted(REGIMES))
@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("processes_per_device", [None, 2.5])  # None: no memory limit; 2.5: three processes refused
def test_search_finds_the_brute_force_best(regime, waits, processes_per_device):
    D, max_stages = 4, 4
    cfg = _cfg(D)
    work, costs = _work(cfg), _costs(regime, waits)
    limit = BIG if processes_per_device is None else int(processes_per_device * costs.process_bytes)
    ranked = rank(screen(cfg, D, max_stages, CONFIG), costs, work, limit)
    # every contiguous device range for each component, one rank per device, every depth: the rules, then the model
    valid = [predict(lay, costs, work)
             for env, rollout, actor in itertools.product(_ranges(D), repeat=3) for s in range(1, max_stages + 1)
             if not rule_refusal(cfg, lay := Layout(env, rollout, actor, s), D, CONFIG)]
    best = min(p.step_s for p in valid if max(p.memory_bytes.values()) <= limit)
    assert ranked[0].prediction.step_s == pytest.approx(best, rel=1e-9)


def test_ranking_follows_predictions_and_refusals_are_named():
    D = 4
    cfg = _cfg(D)
    work, costs = _work(cfg), _costs("balanced", False)
    rows = rank(screen(cfg, D, 4, CONFIG), costs, work, BIG)
    ok = [r for r in rows if not r.refusal]
    steps = [r.prediction.step_s for r in ok]
    assert steps == sorted(steps) and len(ok) >= 4
    assert rows[len(ok):] and all(r.refusal for r in rows[len(ok):])  # the refused after the candidates
    refused = {(r.layout.kind, r.layout.stages, r.layout.env): r.refusal for r in rows if r.refusal}
    assert refused[("disaggregated", 1, (0,))] == ACTOR_RULE
    assert refused[("collocated", 3, (0, 1, 2, 3))].startswith("refused: env.train.total_num_envs:")  # 32 % 12
    # 1 env rank and 3 rollout ranks: the rollout ranks cannot share the env ranks
    assert refused[("hybrid", 1, (0,))].startswith("refused: cluster.component_placement")


def test_memory_refusal_names_the_device_and_the_limit():
    D = 2
    cfg = _cfg(D)
    work, costs = _work(cfg), _costs("env", False)
    rows = rank(screen(cfg, D, 2, CONFIG), costs, work, BIG)
    collocated = next(r for r in rows if r.layout.kind == "collocated" and r.layout.stages == 1)
    hybrid = next(r for r in rows if r.layout.kind == "hybrid" and r.layout.stages == 1)
    # three processes per device collocated, two on each device in the hybrid layout: a limit between the two
    limit = (max(collocated.prediction.memory_bytes.values()) + max(hybrid.prediction.memory_bytes.values())) // 2
    again = rank(screen(cfg, D, 2, CONFIG), costs, work, limit)
    by_key = {(r.layout.kind, r.layout.stages): r for r in again}
    assert by_key[("collocated", 1)].refusal.startswith("refused: memory: device ")
    assert "(--memory-gb)" in by_key[("collocated", 1)].refusal
    assert not by_key[("hybrid", 1)].refusal and again[0].layout.kind == "hybrid"


# --------------------------------------------------------------------------------------------------------------------
# profile_data, the overlay, --explain, errors

PROFILE = ["profile_data.env_profile_data={4: 0.0004, 8: 0.0006, 16: 0.001, 32: 0.0018}",
           "profile_data.rollout_profile_data={4: 0.002, 8: 0.0021, 16: 0.0022, 32: 0.0024}",
           "profile_data.actor_cost=0.05", "profile_data.hop_s=0.0002", "profile_data.fixed_s=0.01"]


def test_profile_data_skips_profiling_and_the_overlay_loads_and_explains(tmp_path, capsys):
    cfg = load_config(["--config", CONFIG, *PROFILE])
    result = autotune(cfg, CONFIG, progress=False)
    assert not result.profiled
    assert result.costs.actor(_work(cfg).samples // 2) == 0.05  # RLinf's actor_cost: the actor on all devices
    best = result.best.layout
    path = tmp_path / "best.yaml"
    write_overlay(best, path, "test")
    loaded = load_config(["--config", CONFIG, "--config", str(path)])
    assert loaded.cluster.component_placement == best.placement()
    assert loaded.rollout.pipeline_stage_num == best.stages
    assert dataclasses.replace(loaded, cluster=cfg.cluster, rollout=cfg.rollout) == dataclasses.replace(
        cfg, profile_data=loaded.profile_data)  # the overlay changes the placement and the depth only
    with_kv = load_config(["--config", CONFIG, *overrides(best)])
    assert (with_kv.cluster.component_placement, with_kv.rollout.pipeline_stage_num) == (
        best.placement(), best.stages)
    assert overlay(best)["cluster"]["component_placement"] == best.placement()
    text, error = explain(loaded, f"{CONFIG} + {path}", num_gpus=0)
    assert error is None and f"plan for {CONFIG} + {path}" in text
    assert f"3 rollout: {len(best.env)} env rank(s) x {best.stages} pipeline stage(s)" in text


def test_cli_with_profile_data_prints_the_table_and_writes_the_overlay(tmp_path, capsys):
    out = tmp_path / "best.yaml"
    assert main(["--config", CONFIG, *PROFILE, "--out", str(out), "--no-progress-bar"]) == 0
    printed = capsys.readouterr().out
    assert "costs (from profile_data)" in printed and "<- your config" in printed
    assert f"--config {CONFIG} --config {out}" in printed and "rollout.pipeline_stage_num=" in printed
    assert out.read_text().startswith("# python -m rlinf_mini.autotune")


@pytest.mark.parametrize("argv,key", [
    (["profile_data.env_profile_dat={4: 1.0}"], "profile_data.env_profile_dat"),
    (["profile_data.env_profile_data={0: 1.0}", *PROFILE[1:]], "profile_data.env_profile_data.0"),
    (["profile_data.env_profile_data={4: -1.0}", *PROFILE[1:]], "profile_data.env_profile_data.4"),
    ([PROFILE[0]], "profile_data.rollout_profile_data"),  # some costs given, not all
])
def test_bad_input_is_one_line_naming_the_key(argv, key, capsys):
    assert main(["--config", CONFIG, *argv, "--no-progress-bar"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and key in err, err


def test_reasoning_is_refused_in_one_line(capsys):
    assert main(["--config", "configs/math.yaml", "--no-progress-bar"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "runner.task_type: reasoning" in err and "not built" in err


def test_overlay_replaces_the_whole_placement(tmp_path):
    """configs/metaworld_reach.yaml places 'env,rollout,actor' under one key; an overlay with a key per component
    replaces it (merged, the env would be placed twice)."""
    hybrid = Layout((0,), (1,), (0, 1), 2, "hybrid")
    write_overlay(hybrid, tmp_path / "o.yaml", "test")
    cfg = load_config(["--config", "configs/metaworld_reach.yaml", "--config", str(tmp_path / "o.yaml")])
    assert cfg.cluster.component_placement == {"env": "0", "rollout": "1", "actor": "all"}
    assert cfg.rollout.pipeline_stage_num == 2 and cfg.env.train.env_type == "metaworld"


def test_explain_says_whether_the_placement_is_the_pick():
    cfg = load_config(["--config", CONFIG, *PROFILE])
    best = autotune(cfg, CONFIG, progress=False).best.layout
    text, error = explain(cfg, CONFIG, num_gpus=0)
    assert error is None
    picked = (cfg.rollout.pipeline_stage_num == best.stages
              and cfg.cluster.component_placement == {"env": "0", "rollout": "1", "actor": "0-1"}
              and best.placement() == {"env": "0", "rollout": "1", "actor": "all"})
    assert ("this placement and depth are its pick" in text) == picked
    assert ("not its pick; the pick is " + best.describe()) in text or picked
    tuned = load_config(["--config", CONFIG, *PROFILE, *overrides(best)])
    assert "this placement and depth are its pick" in explain(tuned, CONFIG, num_gpus=0)[0]
    plain, _ = explain(load_config(["--config", CONFIG]), CONFIG, num_gpus=0)
    assert "autotune" not in plain  # no profile_data: nothing is profiled inside --explain
