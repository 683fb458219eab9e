"""End to end: the same config under every placement mode, pipelined vs unpipelined rollouts (identical
trajectories), weight sync (bitwise), version tags, checkpoints, and a short learning check."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import write_config

from rlinf_mini.config import load_config
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.train import RunPlan, build_and_run, launch
from rlinf_mini.utils.metric_logger import read_metrics
from stages.placement import PlacementMode

SMALL = dict(  # 2 training steps of 16 envs x 8 chunk steps: a few seconds per run
    runner={"max_epochs": 2, "val_check_interval": 2, "save_interval": 2, "progress_bar": False,
            "logger": {"logger_backends": []}},  # TensorBoard's import costs ~2 s; one run below keeps it
    env={"train": {"total_num_envs": 16, "max_steps_per_rollout_epoch": 8},
         "eval": {"total_num_envs": 8, "max_steps_per_rollout_epoch": 8}},
    actor={"global_batch_size": 64, "micro_batch_size": 32},
)


def small_cfg(tmp_path, placement: dict | None, num_devices: int | None, stages: int | None,
              base: str = "configs/embodied_mlp.yaml", **extra):
    """A 2-step version of `base`; placement / num_devices / stages None keep the base file's values."""
    sections = {k: dict(v) for k, v in SMALL.items()}
    if placement is not None:
        sections["cluster"] = {"num_devices": num_devices, "component_placement": placement}
    if stages is not None:
        sections["rollout"] = {"pipeline_stage_num": stages}
    for k, v in extra.items():
        if k == "env":
            sections["env"] = {split: {**sections["env"].get(split, {}), **v.get(split, {})}
                               for split in ("train", "eval")}
        else:
            sections[k] = {**sections.get(k, {}), **v}
    path = write_config(tmp_path, base=base, **sections)
    return load_config(["--config", str(path)]), str(path)


GRPO = {"algorithm": {"adv_type": "grpo", "loss_type": "actor", "group_size": 4},
        "env": {"train": {"group_size": 4, "auto_reset": False}}, "actor": {"model": {"add_value_head": False}}}
REINPP = {"algorithm": {"adv_type": "reinpp", "loss_type": "actor", "group_size": 2, "use_reinpp_baseline": True,
                        "reinpp_kl_beta": 0.01, "kl_beta": 0.01, "kl_penalty_type": "k3"},  # the reference policy
          "env": {"train": {"group_size": 2}}, "runner": {"weight_sync_interval": 2}}


TENSORBOARD = {"runner": {"logger": {"logger_backends": ["tensorboard"]}}}
# The tests that compare runs (trajectories, advantages, weights after a sync) need no processes: they run on the
# inline backend, every rank in this process (measured: 4.7 s on local, 3.0 s inline for the four; the first inline
# run in a process pays its imports). tests/test_backends.py shows that local and inline train bitwise the same; the
# placement test below trains on local, the default.
INLINE = {"backend": "inline"}
CHUNKS = {"actor": {"model": {"num_action_chunks": 2}}}


@pytest.mark.parametrize(
    "base, placement, mode, actor_ranks, stages, algo",
    [
        ("configs/embodied_collocated.yaml", None, PlacementMode.COLLOCATED, 2, 1, CHUNKS),
        ("configs/embodied_disaggregated.yaml", None, PlacementMode.DISAGGREGATED, 1, 2, GRPO),
        ("configs/embodied_mlp.yaml", None, PlacementMode.HYBRID, 2, 2, TENSORBOARD),
        ("configs/embodied_mlp.yaml", {"env,rollout": "0", "actor": "0-1:0"}, PlacementMode.HYBRID, 1, 2, REINPP),
    ],
    ids=["collocated-2actors-1stage-ppo-chunks2", "disaggregated-1actor-2stages-grpo", "hybrid-2actors-2stages-ppo",
         "hybrid-1actor-2stages-reinpp"],
)
def test_same_config_trains_under_every_placement(tmp_path, base, placement, mode, actor_ranks, stages, algo):
    cfg, source = small_cfg(tmp_path, placement, 2 if placement else None, None, base=base, **algo)
    assert cfg.rollout.pipeline_stage_num == stages
    plan = RunPlan(cfg, source)
    assert plan.placement.placement_mode == mode and plan.world_sizes["actor"] == actor_ranks
    history = build_and_run(cfg, plan)
    steps = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        keys = ["train/actor/policy_loss", "env/reward", "time/generate_rollouts"]
        if cfg.algorithm.loss_type == "actor_critic":
            keys.append("train/critic/value_loss")
        else:
            assert "train/critic/value_loss" not in h
        if cfg.algorithm.kl_beta > 0:  # k3 against the frozen initial weights: > 0 once the policy has moved
            keys.append("train/actor/kl_loss")
            assert h["train/actor/kl_loss"] > 0 or h["step"] == 1
        for key in keys:
            assert math.isfinite(h[key]), key
        chunk_steps = 8 // cfg.actor.model.num_action_chunks
        assert h["rollout/samples"] == 16 * (chunk_steps + 1)  # T chunk steps + the bootstrap-value inference
        # trajectories carry the version of the weights that produced them: with weight_sync_interval 2 the
        # second step still runs on the weights of step 0
        stale = (h["step"] - 1) % cfg.runner.weight_sync_interval
        assert h["rollout/staleness"] == stale
    assert "eval/success_once" in history[-1]
    assert read_metrics(plan.run_dir / "metrics.jsonl")[-1]["step"] == 2
    assert (plan.run_dir / "checkpoints" / "global_step_2" / "runner.json").is_file()
    assert load_config(["--config", str(plan.run_dir / "config.yaml")]) == cfg  # resolved config loads back equal
    if cfg.runner.logger.logger_backends:
        assert list((plan.run_dir / "tensorboard").glob("events.out.tfevents.*"))


def collect(tmp_path, placement, num_devices, stages, train_steps: int = 1, **extra):
    """Launch, run `train_steps` steps, and return (each step's batches per actor rank, final actor and rollout
    weights before and after a last sync)."""
    run_tmp = tmp_path / f"run{len(list(tmp_path.iterdir()))}"  # each run its own folder: runs never share one
    run_tmp.mkdir()
    cfg, source = small_cfg(run_tmp, placement, num_devices, stages, **extra)
    plan = RunPlan(cfg, source)
    cluster = Cluster(cfg.cluster)
    try:
        runner = launch(cfg, plan, cluster)
        runner.init_workers()
        batches = []
        for _ in range(train_steps):
            runner.train_step()  # the runner's own four phases
            batches.append(runner.actor.get_rollout_batch().wait())  # the trajectories and their advantages
        trained = runner.actor.get_state_dict().wait()
        before_sync = runner.rollout.get_state_dict().wait()
        runner.update_rollout_weights()
        after_sync = runner.rollout.get_state_dict().wait()
        return batches, trained, before_sync, after_sync
    finally:
        cluster.shutdown()


def cat_ranks(per_rank: list[dict]) -> dict:
    return {k: torch.cat([b[k] for b in per_rank], dim=1) for k in per_rank[0]}


def test_a_batch_cut_from_its_blocks_is_the_cut_of_their_cat():
    """The env rank's pieces for the actor (tree_cat_split): the same as concatenating its stages' blocks and
    slicing, for pieces that are whole blocks (then the block itself, no copy), lie inside one, or span two."""
    from rlinf_mini.utils.tensor_tree import tree_cat, tree_cat_split

    blocks = [{"images": torch.randn(3, w, 2), "ids": torch.arange(3 * w).view(3, w)} for w in (4, 4, 4, 4)]
    for n in (1, 2, 4, 8, 16):  # pieces of 16, 8, 4 (whole blocks), 2 and 1 columns
        whole, width = tree_cat(blocks, dim=1), 16 // n
        pieces = tree_cat_split(blocks, n)
        assert len(pieces) == n
        for q, piece in enumerate(pieces):
            for k in whole:
                assert torch.equal(piece[k], whole[k][:, q * width:(q + 1) * width]), (n, q, k)
    assert tree_cat_split(blocks, 4)[2]["images"] is blocks[2]["images"]
    tensors = [torch.randn(2, 3), torch.randn(2, 5)]  # a piece across the two blocks
    assert [torch.equal(p, w) for p, w in zip(tree_cat_split(tensors, 2), torch.cat(tensors, 1).split(4, 1))] == [
        True, True]


def test_pipelined_and_unpipelined_rollouts_give_identical_trajectories_and_weights(tmp_path):
    one_stage = collect(tmp_path, {"env": "0", "rollout": "1", "actor": "0"}, 2, 1, train_steps=2, cluster=INLINE)
    two_stages = collect(tmp_path, {"env": "0", "rollout": "1", "actor": "0"}, 2, 2, train_steps=2, cluster=INLINE)
    two_env_ranks = collect(tmp_path, {"env": "0-1", "rollout": "0-1", "actor": "0"}, 2, 2, train_steps=2,
                            cluster=INLINE)
    for step in range(2):
        ref = cat_ranks(one_stage[0][step])
        for other in (two_stages, two_env_ranks):
            got = cat_ranks(other[0][step])
            assert ref.keys() == got.keys()
            for k in ref:
                assert torch.equal(ref[k], got[k]), f"step {step}: {k} differs"
        assert (ref["versions"] == step).all()  # every action carries the weight version it was produced with
    for k, v in one_stage[1][0].items():  # and so the trained weights are identical too
        assert torch.equal(v, two_stages[1][0][k]) and torch.equal(v, two_env_ranks[1][0][k]), k


@pytest.mark.parametrize("algo", [{}, REINPP], ids=["gae", "reinpp"])
def test_one_and_two_actor_ranks_compute_the_same_advantages(tmp_path, algo):
    """Whitening takes its statistics over every actor rank: the same trajectories get the same advantages whether
    one actor rank holds them all or two hold half each (and so the first update moves the weights alike)."""
    one = collect(tmp_path, {"env,rollout": "0-1", "actor": "0"}, 2, 1, cluster=INLINE, **algo)
    two = collect(tmp_path, {"env,rollout": "0-1", "actor": "0-1"}, 2, 1, cluster=INLINE, **algo)
    ref, got = cat_ranks(one[0][0]), cat_ranks(two[0][0])
    assert torch.equal(ref["rewards"], got["rewards"])  # the same data
    for key in ("advantages", "returns", "loss_mask"):
        torch.testing.assert_close(got[key], ref[key], atol=1e-5, rtol=1e-5, msg=key)
    assert ref["advantages"][ref["loss_mask"]].std() > 0.5  # whitened, not all zero


def test_after_sync_rollout_weights_equal_actor_weights_bitwise(tmp_path):
    _, trained, before_sync, after_sync = collect(tmp_path, {"env": "0-1", "rollout": "0-1", "actor": "0-1"}, 2, 1,
                                                  cluster=INLINE)
    trained = trained[0]
    assert len(after_sync) == 2  # every rollout rank
    for rollout_weights in before_sync:  # the test can fail: training changed the actor, not the rollout
        assert any(not torch.equal(trained[k], rollout_weights[k]) for k in trained)
    for rollout_weights in after_sync:
        assert rollout_weights.keys() == trained.keys()
        for k in trained:
            assert torch.equal(trained[k], rollout_weights[k]), k


def test_train_lr_is_the_rate_the_cosine_schedule_sets(tmp_path):
    """train/lr is the lr each step's update starts from, down the cosine: torch's own CosineAnnealingLR, run alone
    over the same optimizer steps (warmup 0, num_cycles 0.5: transformers' cosine-with-min-lr is that curve)."""
    lr, floor, total = 0.01, 0.1, 12
    cfg, source = small_cfg(tmp_path, {"env,rollout,actor": "0"}, 1, 1, cluster=INLINE,
                            runner={"max_epochs": 3, "val_check_interval": -1, "save_interval": -1},
                            actor={"optim": {"lr": lr, "value_lr": lr, "lr_scheduler": "cosine",
                                             "lr_warmup_steps": 0, "total_training_steps": total,
                                             "min_lr_rate": floor}})
    history = [h for h in build_and_run(cfg, RunPlan(cfg, source)) if h["step"] > 0]
    samples = cfg.env.train.total_num_envs * cfg.env.train.max_steps_per_rollout_epoch  # T x B, one chunk a step
    per_step = samples // cfg.actor.global_batch_size * cfg.algorithm.update_epoch  # optimizer steps per step
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    alone = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total, eta_min=lr * floor)
    expected = []
    for _ in history:
        expected.append(alone.get_last_lr()[0])
        for _ in range(per_step):
            optimizer.step()
            alone.step()
    assert len(history) == 3 and per_step > 1
    assert [h["train/lr"] for h in history] == pytest.approx(expected, rel=1e-9)
    assert len(set(expected)) == 3 and expected[0] == pytest.approx(lr)  # it moves: not the configured rate


@pytest.mark.slow  # the default suite's learning check is tutorial 06 (eval success rises within 10 steps)
def test_default_config_learns_quickly(tmp_path):
    """A short version of the MLP run: eval success goes from chance to most episodes in 15 steps."""
    path = write_config(tmp_path, runner={"max_epochs": 15, "val_check_interval": 15, "save_interval": -1,
                                          "progress_bar": False, "logger": {"logger_backends": []}})
    cfg = load_config(["--config", str(path)])
    history = build_and_run(cfg, RunPlan(cfg, str(path)))
    evals = [h["eval/success_once"] for h in history if "eval/success_once" in h]
    assert evals[0] <= 0.2 and evals[-1] >= 0.8, evals
