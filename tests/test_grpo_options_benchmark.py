"""benchmarks/grpo_options.py runs what it says: each variant's config loads and differs from plain GRPO in exactly the
keys it claims (so the benchmark cannot run five copies of GRPO), and its figures are read off the runs' rows."""

from __future__ import annotations

import pytest

from benchmarks import grpo_options, healthy_runs
from benchmarks.grpo_options import SMOLLM2, VARIANTS, differing_keys, variant_config

BY_NAME = {v.name: v for v in VARIANTS + SMOLLM2}


def test_the_math_variants_are_the_five_the_issue_names():
    assert [v.name for v in VARIANTS] == ["grpo", "dapo", "dr_grpo", "gspo", "dyn_sampling"]
    assert all(v.recipe.config == "math_smollm2" for v in SMOLLM2)
    assert all("runner.val_pass_k=4" in v.recipe.overrides for v in VARIANTS)  # every run logs eval/pass@4


@pytest.mark.parametrize("variant", [v for v in VARIANTS + SMOLLM2 if v.baseline], ids=lambda v: v.name)
def test_each_variant_differs_from_its_baseline_in_exactly_the_keys_it_claims(variant):
    base = variant_config(BY_NAME[variant.baseline])
    diff = differing_keys(variant_config(variant), base)
    assert variant.claims, "a variant without claims would be its baseline again"
    assert diff == {k: (v, baseline_value(base, k)) for k, v in variant.claims}


def baseline_value(cfg, key: str):
    return grpo_options.flat(cfg)[key]


def test_the_baselines_change_nothing_and_the_shipped_configs_are_the_healthy_run_recipes():
    for v in VARIANTS + SMOLLM2:
        assert bool(v.baseline) == bool(v.claims)
    assert BY_NAME["dapo"].recipe in healthy_runs.RECIPES and BY_NAME["gspo"].recipe in healthy_runs.RECIPES
    assert (BY_NAME["dapo"].recipe.config, BY_NAME["gspo"].recipe.config) == ("math_dapo", "math_gspo")


def test_differing_keys_sees_a_one_key_change_and_ignores_the_results_folder_name():
    grpo = variant_config(BY_NAME["grpo"])
    assert differing_keys(grpo, grpo) == {}
    from rlinf_mini.config import load_config

    changed = load_config(["--config", str(grpo_options.ROOT / "configs/math.yaml"), "runner.val_pass_k=4",
                           "algorithm.kl_beta=0.1", "runner.logger.experiment_name=other"])
    assert differing_keys(changed, grpo) == {"algorithm.kl_beta": (0.1, 0.0)}


def test_a_runs_figures_come_from_its_rows():
    rows = [{"step": 0, "eval/accuracy": 0.4, "eval/pass@4": 0.6}, {"step": 1, "rollout/dropped_groups": 2.0},
            {"step": 2, "rollout/dropped_groups": 0.0, "eval/accuracy": 0.85, "eval/pass@4": 0.9},
            {"step": 4, "eval/accuracy": 0.9, "eval/pass@4": 0.95}]
    run = {"seed": 0, "exit_code": 0, "wall_s": 30.0, "cpu_s": 20.0, "load": [1.0, 1.0], "last_line": "", "rows": rows}
    f = grpo_options.run_figures(run)
    assert (f["start"], f["final"], f["final_pass@4"], f["step_to_target"]) == (0.4, 0.9, 0.95, 2)
    assert f["gain_per_wall_min"] == pytest.approx(0.5 / 0.5) and f["mean rollout/dropped_groups"] == 1.0
    s = grpo_options.summary([f, grpo_options.run_figures({**run, "seed": 1})])
    assert s["final"] == {"mean": 0.9, "min": 0.9, "max": 0.9} and s["runs_reaching_target"] == 2
    failed = grpo_options.run_figures({**run, "exit_code": 1})
    assert "final" not in failed and grpo_options.summary([failed])["failed"] == 1
