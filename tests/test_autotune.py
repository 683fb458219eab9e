"""The placement autotune (rlinf_mini/autotune/): the pipeline formula against an event-by-event simulation of the
env/rollout protocol, the search against a brute-force enumeration of every layout, the ranking, the named refusals,
RLinf's profile_data, the overlay the train command loads, and one-line errors; the reasoning half's formula against
a simulation of its runner's protocol and its search against brute force, likewise. Fixed costs only: no test here
profiles or starts a process (the measured check is benchmarks/autotune_check.py)."""

import dataclasses
import itertools

import pytest

from rlinf_mini.autotune.__main__ import autotune, main, overlay, overrides, write_overlay
from rlinf_mini.autotune.model import Affine, Costs, Layout, Workload, cycle_terms, predict
from rlinf_mini.autotune import reasoning
from rlinf_mini.autotune.reasoning import ReasoningCosts, ReasoningLayout, ReasoningWorkload, candidate_layouts, \
    predict_reasoning
from rlinf_mini.autotune.search import ACTOR_RULE, rank, rule_refusal, screen
from rlinf_mini.config import ConfigError, load_config
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


# --------------------------------------------------------------------------------------------------------------------
# The reasoning half: rollout -> reward -> actor

MATH = "configs/math.yaml"
MATH_PROFILE = ["profile_data.rollout_cost=0.1", "profile_data.actor_cost=0.2", "profile_data.inference_cost=0.04",
                "profile_data.hop_s=0.002", "profile_data.fixed_s=0.003"]


def simulate_reasoning_step(layout: ReasoningLayout, G: float, R: float, A: float, hop: float) -> float:
    """The runner's step, event by event, with ranks on one device splitting its core evenly: rollout rank r
    generates chunks r, r + W_r, ... in turn; reward rank w scores chunks w, w + W_w, ... in turn, each once it is
    generated; actor rank a trains once its block of chunks is scored. A message from a rank on another device
    reaches its receiver `hop` later (a wait, no core). Returns when the last actor rank ends."""
    K = layout.stages
    wr, ww, wa = len(layout.rollout), len(layout.reward), len(layout.actor)
    ranks = ([(d, [((), G, ("gen", c)) for c in range(r, K, wr)]) for r, d in enumerate(layout.rollout)]
             + [(d, [((("gen", c),), R, ("scored", c)) for c in range(w, K, ww)]) for w, d in enumerate(layout.reward)]
             + [(d, [(tuple(("scored", c) for c in range(a * K // wa, (a + 1) * K // wa)), A, ("done", a))])
                for a, d in enumerate(layout.actor)])
    device_of = {("gen", c): layout.rollout[c % wr] for c in range(K)} | {
        ("scored", c): layout.reward[c % ww] for c in range(K)}
    done, t = {}, 0.0
    state = [{"task": 0, "phase": "wait", "until": 0.0, "left": 0.0} for _ in ranks]
    while True:
        moved = True
        while moved:  # every transition possible at time t
            moved = False
            for i, ((_, tasks), st) in enumerate(zip(ranks, state, strict=True)):
                if st["task"] == len(tasks):
                    continue
                deps, work, event = tasks[st["task"]]
                if st["phase"] == "wait" and all(e in done for e in deps):
                    arrive = [done[e] + hop * (device_of[e] != ranks[i][0]) for e in deps]
                    st["phase"], st["until"], moved = "hop", max([t, *arrive]), True
                elif st["phase"] == "hop" and st["until"] <= t + 1e-12:
                    st["phase"], st["left"], moved = "compute", work, True
                elif st["phase"] == "compute" and st["left"] <= 1e-12:
                    done[event], st["task"], st["phase"], moved = t, st["task"] + 1, "wait", True
        if all(st["task"] == len(tasks) for (_, tasks), st in zip(ranks, state, strict=True)):
            return max(done[("done", a)] for a in range(wa))
        computing = [(d, st) for (d, tasks), st in zip(ranks, state, strict=True)
                     if st["task"] < len(tasks) and st["phase"] == "compute"]
        share = {d: sum(1 for dd, _ in computing if dd == d) for d, _ in computing}
        waits = [st["until"] - t for (_, tasks), st in zip(ranks, state, strict=True)
                 if st["task"] < len(tasks) and st["phase"] == "hop"]
        dt = min(waits + [st["left"] * share[d] for d, st in computing])
        for d, st in computing:
            st["left"] -= dt / share[d]
        t += dt


@pytest.mark.parametrize("num_devices", [2, 3])
def test_reasoning_formula_against_an_event_simulation(num_devices):
    """Exact where no device holds two components; a lower bound elsewhere, within 35 % of the simulation for
    reward costs up to a fifth of the generation's."""
    work = ReasoningWorkload(8, 8)
    exact = shared = 0
    for lay in candidate_layouts(num_devices, work, 8):
        if lay.stages % len(lay.actor):
            continue
        b, m = work.responses // lay.stages, work.responses // len(lay.actor)
        one_component = all(sum(r.count(d) for r in (lay.rollout, lay.reward, lay.actor)) == 1
                            for d in range(num_devices))
        for G, R, A, hop in itertools.product([0.1, 1.0], [0.0, 0.02, 0.2], [0.1, 3.0], [0.0, 0.05]):
            costs = ReasoningCosts(Affine.of({b: G}), Affine.of({b: R * G}), Affine.of({m: A}), hop_s=hop)
            predicted = predict_reasoning(lay, costs, work).step_s
            simulated = simulate_reasoning_step(lay, G, R * G, A, hop)
            if one_component:
                assert predicted == pytest.approx(simulated, rel=1e-9), (lay, G, R, A, hop)
                exact += 1
            else:
                assert predicted <= simulated * (1 + 1e-9) and simulated <= predicted * 1.35, (lay, G, R, A, hop)
                shared += 1
    assert shared and (exact or num_devices < 3)  # 3 components need 3 devices to have one each


def _math(num_devices: int, *extra: str):
    return load_config(["--config", MATH, f"cluster.num_devices={num_devices}", "actor.micro_batch_size=32", *extra])


REASONING_REGIMES = {  # G(b), R(b), A(m): generation-bound, actor-bound, reward-heavy (a slow verifier)
    "generation": (Affine.of({8: 0.05, 128: 0.6}), Affine.of({8: 0.001, 128: 0.01}), Affine.of({32: 0.05, 128: 0.2})),
    "actor": (Affine.of({8: 0.01, 128: 0.1}), Affine.of({8: 0.001, 128: 0.01}), Affine.of({32: 0.2, 128: 0.8})),
    "reward": (Affine.of({8: 0.02, 128: 0.2}), Affine.of({8: 0.02, 128: 0.3}), Affine.of({32: 0.05, 128: 0.2})),
}


@pytest.mark.parametrize("regime", sorted(REASONING_REGIMES))
@pytest.mark.parametrize("num_devices", [2, 3])
def test_reasoning_search_finds_the_brute_force_best(regime, num_devices):
    cfg = _math(num_devices)
    work = reasoning.workload(cfg)
    costs = ReasoningCosts(*REASONING_REGIMES[regime], hop_s=0.001, sync_s=0.002, fixed_s=0.003)
    ranked = rank(reasoning.screen(cfg, num_devices, 4, MATH), costs, work, BIG,
                  predictor=reasoning.predict_reasoning)
    valid = []  # every contiguous device range for each component, one rank per device, every chunk count: the rules
    for ranks in itertools.product(_ranges(num_devices), repeat=3):
        for k in work.chunk_counts(4):
            lay = ReasoningLayout(*ranks, stages=k, prompts_per_chunk=work.prompts // k)
            try:
                reasoning.check_reasoning_plan(reasoning.layout_config(cfg, lay), MATH)
            except ConfigError:
                continue
            valid.append(reasoning.predict_reasoning(lay, costs, work).step_s)
    assert ranked[0].prediction.step_s == pytest.approx(min(valid), rel=1e-9)
    steps = [r.prediction.step_s for r in ranked if not r.refusal]
    assert steps == sorted(steps)


def test_reasoning_refusals_are_named():
    cfg = load_config(["--config", MATH])  # actor.micro_batch_size 128 = global_batch_size: one actor rank
    work = reasoning.workload(cfg)
    costs = ReasoningCosts(*REASONING_REGIMES["generation"], process_bytes=2**28, weight_bytes=2**20, sample_bytes=64)
    rows = rank(reasoning.screen(cfg, 2, 4, MATH), costs, work, BIG, predictor=reasoning.predict_reasoning)
    refused = {(r.layout.describe(), r.layout.stages): r.refusal for r in rows if r.refusal}
    assert refused[("rollout,reward,actor: all", 1)].startswith(
        "refused: algorithm.rollout_batch_size_per_gpu:")  # 1 chunk over 2 actor ranks
    assert refused[("rollout,reward,actor: all", 2)].startswith("refused: actor.global_batch_size:")  # 128 x 2
    assert all(len(r.layout.actor) == 2 for r in rows if r.refusal)
    assert all(not r.refusal for r in rows if len(r.layout.actor) == 1)
    # memory: a limit between the busiest device of the 3-process hybrid and of a 2-process disaggregated layout
    peak = {r.layout.describe(): max(r.prediction.memory_bytes.values()) for r in rows if not r.refusal}
    hybrid, split = peak["rollout,reward: all | actor: 0"], peak["rollout,reward: 0 | actor: 1"]
    assert hybrid > split
    again = rank(reasoning.screen(cfg, 2, 4, MATH), costs, work, (hybrid + split) // 2,
                 predictor=reasoning.predict_reasoning)
    by = {(r.layout.describe(), r.layout.stages): r for r in again}
    assert by[("rollout,reward: all | actor: 0", 4)].refusal.startswith("refused: memory: device ")
    assert not by[("rollout,reward: 0 | actor: 1", 4)].refusal


def test_reasoning_profile_data_overlay_loads_and_explain_says_the_pick(tmp_path, capsys):
    cfg = load_config(["--config", MATH, *MATH_PROFILE])
    result = autotune(cfg, MATH, progress=False)
    assert not result.profiled
    chunks = cfg.data.rollout_batch_size // cfg.algorithm.rollout_batch_size_per_gpu
    b = result.work.responses // chunks  # RLinf's rollout_cost: the step's generation on both devices
    assert result.costs.generate(b) == pytest.approx(0.1 * 2 / chunks)
    assert result.costs.actor(result.work.responses // 2) == pytest.approx(0.24)  # actor_cost + inference_cost
    assert result.current in result.rows and not result.current.refusal  # math.yaml's layout, or its mirror image
    best = result.best.layout
    path = tmp_path / "best.yaml"
    write_overlay(best, path, "test")
    loaded = load_config(["--config", MATH, *MATH_PROFILE, "--config", str(path)])
    assert loaded.cluster.component_placement == best.placement()
    assert loaded.algorithm.rollout_batch_size_per_gpu == best.prompts_per_chunk
    assert dataclasses.replace(loaded, cluster=cfg.cluster, algorithm=cfg.algorithm) == cfg
    with_kv = load_config(["--config", MATH, *overrides(best)])
    assert (with_kv.cluster.component_placement, with_kv.algorithm.rollout_batch_size_per_gpu) == (
        best.placement(), best.prompts_per_chunk)
    text, error = explain(loaded, f"{MATH} + {path}", num_gpus=0)
    assert error is None and "autotune (profile_data): this placement and depth are its pick" in text
    if result.current is not result.best:
        assert "not its pick; the pick is " + best.describe() in explain(cfg, MATH, num_gpus=0)[0]
    assert "autotune" not in explain(load_config(["--config", MATH]), MATH, num_gpus=0)[0]
    out = tmp_path / "cli.yaml"
    assert main(["--config", MATH, *MATH_PROFILE, "--out", str(out), "--no-progress-bar"]) == 0
    printed = capsys.readouterr().out
    assert "G(b), one chunk's generation" in printed and "<- your config" in printed
    assert "algorithm.rollout_batch_size_per_gpu=" in printed and out.exists()


@pytest.mark.parametrize("argv,key", [
    (["profile_data.rollout_cost=0.1"], "profile_data.actor_cost"),  # some costs given, not all
    (["profile_data.rollout_profile_data={0: 1.0}", "profile_data.actor_cost=0.1"],
     "profile_data.rollout_profile_data.0"),
    (["data.rollout_batch_size=12"], "actor.global_batch_size"),  # the config itself fails a run's checks
])
def test_reasoning_bad_input_is_one_line(argv, key, capsys):
    assert main(["--config", MATH, *argv, "--no-progress-bar"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and key in err, err


def test_profile_data_given_in_part_is_one_line_naming_the_missing_cost_in_both_halves():
    from rlinf_mini.autotune import profile
    from rlinf_mini.autotune.__main__ import workload

    cfg = load_config(["--config", CONFIG, "profile_data.env_profile_data={16: 0.001}"])
    with pytest.raises(ConfigError, match=r"profile_data\.rollout_profile_data: missing; give the env's"):
        profile.given_costs(cfg, workload(cfg), 2, CONFIG)
    assert profile.given_costs(load_config(["--config", CONFIG]), workload(cfg), 2, CONFIG) is None  # none: profile
    cfg = load_config(["--config", MATH, "profile_data.rollout_cost=0.1"])
    with pytest.raises(ConfigError, match=r"profile_data\.actor_cost \(or actor_profile_data\): missing; give the"):
        reasoning.given_costs(cfg, 2, MATH)
    assert reasoning.given_costs(load_config(["--config", MATH]), 2, MATH) is None
