"""Observation and return normalisation (actor.model.normalize_obs, env.train.normalize_reward): the running moments
against plain reference loops, and a run that shares its statistics with the rollout, saves them and resumes them."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import write_config

from rlinf_mini.config import load_config
from rlinf_mini.models.mlp_policy import MLPPolicy
from rlinf_mini.runners.base import find_latest_checkpoint
from rlinf_mini.train import RunPlan, build_and_run
from rlinf_mini.utils.metric_logger import read_metrics
from rlinf_mini.utils.running_stats import (
    CLIP,
    EPSILON,
    START_COUNT,
    ObsNormalizer,
    ReturnScaler,
    merge_moments,
    moment_sums,
    moments_from_sums,
)


def test_merged_moments_are_the_moments_of_all_the_data():
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(n, 3, generator=g, dtype=torch.float64) * 4 + 2 for n in (1, 7, 50, 3)]
    mean, var, count = batches[0].mean(0), batches[0].var(0, correction=0), 1.0
    for b in batches[1:]:
        mean, var, count = merge_moments(mean, var, count, b.mean(0), b.var(0, correction=0), b.shape[0])
    data = torch.cat(batches)
    assert count == len(data)
    torch.testing.assert_close(mean, data.mean(0))
    torch.testing.assert_close(var, data.var(0, correction=0))
    # what the ranks all-reduce: sums add up to the moments of the union
    m, v, n = moments_from_sums(sum(moment_sums(b) for b in batches))
    assert n == len(data)
    torch.testing.assert_close(m, data.mean(0))
    torch.testing.assert_close(v, data.var(0, correction=0))


def test_the_obs_normalizer_is_a_plain_running_mean_and_variance():
    """Oracle: Welford's one-sample-at-a-time loop in Python floats, started from SB3's prior (mean 0, var 1, count
    1e-4); then (x - mean) / sqrt(var + 1e-8), clipped to [-10, 10]."""
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(n, 2, generator=g) * torch.tensor([0.01, 30.0]) + torch.tensor([5.0, -1.0])
               for n in (4, 9, 2)]
    norm = ObsNormalizer(2)
    ref = [[0.0, 1.0 * START_COUNT, START_COUNT] for _ in range(2)]  # per dim: mean, M2, count
    for b in batches:
        norm.update(b)
        for row in b.tolist():
            for d, x in enumerate(row):
                mean, m2, n = ref[d]
                n += 1
                delta = x - mean
                mean += delta / n
                m2 += delta * (x - mean)
                ref[d] = [mean, m2, n]
    assert norm.count.item() == pytest.approx(START_COUNT + 15)
    for d in range(2):
        assert norm.mean[d].item() == pytest.approx(ref[d][0], rel=1e-9, abs=1e-12)
        assert norm.var[d].item() == pytest.approx(ref[d][1] / ref[d][2], rel=1e-9)
    x = torch.tensor([[5.0, -1.0], [5.5, 20.0]])
    want = [[max(-CLIP, min(CLIP, (x[i, d].item() - ref[d][0]) / math.sqrt(ref[d][1] / ref[d][2] + EPSILON)))
             for d in range(2)] for i in range(2)]
    torch.testing.assert_close(norm(x), torch.tensor(want))
    assert norm(x)[1, 0] == CLIP  # 0.5 away in a dim whose std is ~0.01: clipped


def test_the_return_scaler_is_sb3_vecnormalize_reward_per_sub_env():
    """Oracle: SB3 VecNormalize's reward path for each sub-env on its own, in Python floats: ret = ret * gamma + r;
    merge ret into the running moments; r / sqrt(var + 1e-8), clipped; ret = 0 where the episode ended."""
    g = torch.Generator().manual_seed(2)
    T, B, C, gamma = 12, 3, 2, 0.9
    rewards = torch.randn(T, B, C, generator=g) * torch.tensor([1.0, 50.0, 0.001]).view(1, B, 1)
    dones = torch.rand(T, B, C, generator=g) < 0.2
    scaler = ReturnScaler(B, gamma)
    got = torch.stack([scaler(rewards[t], dones[t]) for t in range(T)])  # [T, B, C]
    for b in range(B):
        ret, mean, m2, n = 0.0, 0.0, START_COUNT, START_COUNT
        for t in range(T):
            for c in range(C):
                r = rewards[t, b, c].item()
                ret = ret * gamma + r
                n += 1
                delta = ret - mean
                mean += delta / n
                m2 += delta * (ret - mean)
                want = max(-CLIP, min(CLIP, r / math.sqrt(m2 / n + EPSILON)))
                assert got[t, b, c].item() == pytest.approx(want, rel=1e-5, abs=1e-6), (t, b, c)
                if dones[t, b, c]:
                    ret = 0.0
    assert scaler.count.tolist() == pytest.approx([START_COUNT + T * C] * B)
    copy = ReturnScaler(B, gamma)
    copy.load_state_dict(scaler.state_dict())
    torch.testing.assert_close(copy(rewards[0], dones[0]), scaler(rewards[0], dones[0]))


def test_a_saved_model_folder_keeps_its_statistics(tmp_path):
    policy = MLPPolicy(obs_dim=3, action_dim=2, discrete=False, normalize_obs=True)
    policy.obs_normalizer.update(torch.randn(20, 3) * 7 + 3)
    policy.save_pretrained(tmp_path / "m")
    loaded = MLPPolicy.from_pretrained(tmp_path / "m")
    for k, v in policy.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    obs = torch.randn(5, 3) * 7 + 3
    torch.testing.assert_close(loaded.predict_action_batch(obs, None, "eval")["actions"],
                               policy.predict_action_batch(obs, None, "eval")["actions"])


# --- a run ------------------------------------------------------------------------------------------------------

T, ENVS = 8, 16
RUN = dict(  # two actor ranks (the statistics are all-reduced); one optimizer step per training step
    runner={"val_check_interval": -1, "save_interval": 2, "progress_bar": False, "logger": {"logger_backends": []}},
    algorithm={"update_epoch": 1},
    env={"train": {"total_num_envs": ENVS, "max_steps_per_rollout_epoch": T, "normalize_reward": True},
         "eval": {"total_num_envs": 8, "max_steps_per_rollout_epoch": 8}},
    actor={"global_batch_size": T * ENVS, "micro_batch_size": T * ENVS // 2, "model": {"normalize_obs": True}},
)


def _train(tmp_path, log_dir, steps: int, resume: str | None = None):
    path = write_config(tmp_path, **RUN)
    argv = ["--config", str(path), f"runner.max_epochs={steps}", f"runner.logger.log_path={log_dir}"]
    if resume:
        argv.append(f"runner.resume_dir={resume}")
    cfg = load_config(argv)
    plan = RunPlan(cfg, str(path))
    build_and_run(cfg, plan)
    return plan.run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("normalized")
    straight = _train(tmp_path, tmp_path / "straight", steps=4)
    split = _train(tmp_path, tmp_path / "split", steps=2)
    _train(tmp_path, tmp_path / "split", steps=4, resume="auto")
    return straight, split


def test_the_statistics_count_every_sample_of_every_rank_and_reach_the_rollout(runs):
    straight, _ = runs
    ckpt = find_latest_checkpoint(straight)
    model = torch.load(ckpt / "actor/actor.pt", weights_only=True)["model"]
    assert model["obs_normalizer.count"].item() == pytest.approx(START_COUNT + 4 * T * ENVS)  # both ranks' halves
    assert not torch.allclose(model["obs_normalizer.var"], torch.ones_like(model["obs_normalizer.var"]))
    env = torch.load(ckpt / "env.pt", weights_only=True)
    scalers = [s for rank in env for s in rank["return_scalers"]]  # one per pipeline stage of each env rank
    assert sum(len(s["count"]) for s in scalers) == ENVS
    assert all(c == pytest.approx(START_COUNT + 4 * T) for s in scalers for c in s["count"].tolist())
    # One optimizer step per training step, taken after the ratio is measured: the actor's log-probs equal the
    # rollout's only if the rollout normalised the obs with the actor's statistics (they change every step).
    rows = [r for r in read_metrics(straight / "metrics.jsonl") if "train/actor/approx_kl" in r]
    assert len(rows) == 4 and all(r["train/actor/approx_kl"] < 1e-9 for r in rows), rows
    # env/return is the raw return; the trajectory's rewards are scaled
    assert all("env/reward" in r for r in rows)


def test_a_resumed_run_restores_the_statistics_bitwise(runs):
    straight, split = runs
    a = torch.load(straight / "checkpoints/global_step_4/actor/actor.pt", weights_only=True)["model"]
    b = torch.load(split / "checkpoints/global_step_4/actor/actor.pt", weights_only=True)["model"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ea = torch.load(straight / "checkpoints/global_step_4/env.pt", weights_only=True)
    eb = torch.load(split / "checkpoints/global_step_4/env.pt", weights_only=True)
    for ra, rb in zip(ea, eb, strict=True):
        for sa, sb in zip(ra["return_scalers"], rb["return_scalers"], strict=True):
            for k in sa:
                assert torch.equal(sa[k], sb[k]), k

    def logged(run_dir):
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "sync/"))}
                for m in read_metrics(run_dir / "metrics.jsonl")]

    assert logged(straight) == logged(split)
