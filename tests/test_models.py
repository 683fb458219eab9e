"""MLPPolicy: rollout and actor agree on logprobs, sampling follows the distribution, folders round-trip."""

import json

import numpy
import pytest
import torch

from rlinf_mini.config import ModelConfig
from rlinf_mini.models import MLPPolicy, build_policy
from rlinf_mini.utils.seeding import counter_uniform

OBS_DIM, ACTION_DIM, B = 5, 3, 64


def make(discrete: bool, chunks: int = 1, seed: int = 0, **kw) -> MLPPolicy:
    torch.manual_seed(seed)
    return MLPPolicy(OBS_DIM, ACTION_DIM, discrete, num_action_chunks=chunks, **kw)


def noise_for(policy: MLPPolicy, n_rows: int, seed: int = 7, counter: int = 0) -> torch.Tensor:
    return counter_uniform(seed, torch.arange(n_rows), counter, policy.num_action_chunks * ACTION_DIM)


def obs_batch(n: int = B) -> torch.Tensor:
    return torch.randn(n, OBS_DIM, generator=torch.Generator().manual_seed(3))


def skew_head(policy: MLPPolicy) -> None:
    """Make the policy's distribution far from the 0.01-init one, so the statistical checks test something."""
    head = policy.actor_logits if policy.discrete else policy.actor_mean
    with torch.no_grad():
        head.bias.copy_(torch.linspace(-1.0, 1.5, head.bias.numel()))
        if not policy.discrete:
            policy.actor_logstd.copy_(torch.linspace(-1.0, 0.5, policy.actor_logstd.numel()))


@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("chunks", [1, 3])
def test_logprobs_match_between_rollout_and_training(discrete, chunks):
    policy = make(discrete, chunks)
    skew_head(policy)
    obs = obs_batch()
    with torch.no_grad():
        out = policy.predict_action_batch(obs, noise_for(policy, B))
    if discrete:
        assert out["actions"].shape == (B, chunks) and out["actions"].dtype == torch.int64
    else:
        assert out["actions"].shape == (B, chunks, ACTION_DIM) and out["actions"].dtype == torch.float32
    assert out["logprobs"].shape == out["values"].shape == (B,)
    train = policy.default_forward(obs, out["actions"])
    torch.testing.assert_close(train["logprobs"], out["logprobs"], atol=1e-6, rtol=0)
    torch.testing.assert_close(train["values"], out["values"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("discrete", [False, True])
def test_eval_mode_is_deterministic_and_ignores_noise(discrete):
    policy = make(discrete, chunks=2)
    skew_head(policy)
    obs = obs_batch()
    with torch.no_grad():
        a = policy.predict_action_batch(obs, None, mode="eval")["actions"]
        b = policy.predict_action_batch(obs, noise_for(policy, B), mode="eval")["actions"]
        head = policy._head(obs)  # [B, C, A]
    assert torch.equal(a, b)
    assert torch.equal(a, head.argmax(-1) if discrete else head)


@pytest.mark.parametrize("discrete", [False, True])
def test_fixed_noise_gives_fixed_actions(discrete):
    policy = make(discrete, chunks=2)
    obs = obs_batch()
    with torch.no_grad():
        a = policy.predict_action_batch(obs, noise_for(policy, B, counter=5))["actions"]
        b = policy.predict_action_batch(obs, noise_for(policy, B, counter=5))["actions"]
        c = policy.predict_action_batch(obs, noise_for(policy, B, counter=6))["actions"]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_train_mode_needs_noise_of_the_right_shape():
    policy = make(False, chunks=2)
    with pytest.raises(ValueError, match="noise"):
        policy.predict_action_batch(obs_batch(), None)
    with pytest.raises(ValueError, match=r"\(64, 6\)"):
        policy.predict_action_batch(obs_batch(), torch.rand(B, ACTION_DIM))


def test_gaussian_samples_have_the_model_mean_and_std():
    policy, n = make(False, chunks=2), 20_000
    skew_head(policy)
    obs = obs_batch(1).expand(n, OBS_DIM)  # one state, many draws
    with torch.no_grad():
        actions = policy.predict_action_batch(obs, noise_for(policy, n))["actions"]  # [n, C, A]
        mean = policy._head(obs[:1])[0]  # [C, A]
    std = policy.actor_logstd.detach().exp().reshape(2, ACTION_DIM)  # [C, A]
    assert ((actions.mean(0) - mean).abs() <= 4 * std / n**0.5).all()
    torch.testing.assert_close(actions.std(0), std, rtol=0.03, atol=0)


def test_categorical_samples_follow_softmax():
    policy, n = make(True, chunks=2), 20_000
    skew_head(policy)
    obs = obs_batch(1).expand(n, OBS_DIM)
    with torch.no_grad():
        actions = policy.predict_action_batch(obs, noise_for(policy, n))["actions"]  # [n, C]
        probs = policy._head(obs[:1])[0].softmax(-1)  # [C, n_choices]
    freqs = torch.nn.functional.one_hot(actions, ACTION_DIM).float().mean(0)  # [C, n_choices]
    torch.testing.assert_close(freqs, probs, atol=0.015, rtol=0)


@pytest.mark.parametrize("discrete", [False, True])
def test_logprobs_and_entropy_match_torch_distributions(discrete):
    policy = make(discrete, chunks=3)
    skew_head(policy)
    obs = obs_batch()
    with torch.no_grad():
        actions = policy.predict_action_batch(obs, noise_for(policy, B))["actions"]
        out = policy.default_forward(obs, actions)
        head = policy._head(obs)  # [B, C, A]
    if discrete:
        dist = torch.distributions.Categorical(logits=head)  # batch shape [B, C]
    else:
        std = policy.actor_logstd.exp().reshape(3, ACTION_DIM).expand_as(head)  # [B, C, A]
        dist = torch.distributions.Normal(head, std)
    ref_logprob = dist.log_prob(actions).flatten(1).sum(-1)  # [B]
    ref_entropy = dist.entropy().flatten(1).sum(-1)  # [B]
    torch.testing.assert_close(out["logprobs"], ref_logprob, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(out["entropy"], ref_entropy, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("discrete", [False, True])
def test_save_and_load_round_trip(tmp_path, discrete):
    policy = make(discrete, chunks=2, hidden_dim=16)
    skew_head(policy)
    folder = tmp_path / "model"
    policy.save_pretrained(folder)
    policy.save_pretrained(folder)  # overwriting an existing folder works too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp folders left behind
    config = json.loads((folder / "config.json").read_text())
    assert config == {**policy.config, "model_type": "mlp_policy"}

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    loaded = MLPPolicy.from_pretrained(folder)
    assert torch.equal(torch.rand(1), before)  # loading does not consume the global RNG
    assert loaded.config == policy.config
    sd, sd_loaded = policy.state_dict(), loaded.state_dict()
    assert sd.keys() == sd_loaded.keys() and all(torch.equal(sd[k], sd_loaded[k]) for k in sd)
    obs, noise = obs_batch(), noise_for(policy, B)
    with torch.no_grad():
        a, b = policy.predict_action_batch(obs, noise), loaded.predict_action_batch(obs, noise)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_from_pretrained_names_the_bad_folder(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path)):
        MLPPolicy.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "openvla"}))
    with pytest.raises(ValueError, match="openvla"):
        MLPPolicy.from_pretrained(tmp_path)


def test_build_policy_takes_dims_from_the_env(tmp_path):
    cfg = ModelConfig(num_action_chunks=2, hidden_dim=8)
    policy = build_policy(cfg, obs_dim=OBS_DIM, action_dim=ACTION_DIM, discrete=False)
    assert policy.config == {"obs_dim": OBS_DIM, "action_dim": ACTION_DIM, "discrete": False,
                             "num_action_chunks": 2, "hidden_dim": 8, "add_value_head": True,
                             "normalize_obs": False, "init_logstd": -0.5, "obs_norm_min_std": 0.0}
    assert torch.equal(policy.actor_logstd, torch.full((2 * ACTION_DIM,), -0.5))  # RLinf's MLPPolicy starts at -0.5
    wide = build_policy(ModelConfig(num_action_chunks=2, hidden_dim=8, init_logstd=0.0), obs_dim=OBS_DIM,
                        action_dim=ACTION_DIM, discrete=False)  # SB3's and CleanRL's start: std 1
    assert wide.config["init_logstd"] == 0.0 and torch.equal(wide.actor_logstd, torch.zeros(2 * ACTION_DIM))
    with pytest.raises(ValueError, match="actor.model.obs_dim"):
        build_policy(ModelConfig(obs_dim=7), obs_dim=OBS_DIM, action_dim=ACTION_DIM, discrete=False)

    policy.save_pretrained(tmp_path / "m")
    cfg.model_path = str(tmp_path / "m")
    loaded = build_policy(cfg, obs_dim=OBS_DIM, action_dim=ACTION_DIM, discrete=False)
    pairs = zip(policy.state_dict().values(), loaded.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    with pytest.raises(ValueError, match="actor.model.model_path"):
        build_policy(cfg, obs_dim=OBS_DIM + 1, action_dim=ACTION_DIM, discrete=False)
    with pytest.raises(ValueError, match="actor.model.model_path"):
        build_policy(cfg, obs_dim=OBS_DIM, action_dim=ACTION_DIM, discrete=True)


@pytest.mark.parametrize("discrete", [False, True])
def test_value_parameters_are_the_value_head_only(discrete):
    policy = make(discrete)
    value_ids = {id(p) for p in policy.value_parameters()}
    other_ids = {id(p) for p in policy.parameters()} - value_ids
    assert value_ids and other_ids and len(value_ids) + len(other_ids) == len(list(policy.parameters()))
    no_head = make(discrete, add_value_head=False)
    assert no_head.value_parameters() == []
    with torch.no_grad():
        assert torch.equal(no_head.predict_action_batch(obs_batch(), None, mode="eval")["values"], torch.zeros(B))


@pytest.mark.parametrize("discrete", [False, True])
def test_gradients_reach_every_parameter(discrete):
    policy = make(discrete, chunks=2)
    obs = obs_batch()
    with torch.no_grad():
        actions = policy.predict_action_batch(obs, noise_for(policy, B))["actions"]
    out = policy.default_forward(obs, actions)
    (out["logprobs"].sum() + out["entropy"].sum() + out["values"].sum()).backward()
    for name, p in policy.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_uniforms_never_reach_0_or_1_not_even_at_the_extreme_hashes():
    """The top 24-bit step, offset by half a step, rounds to 1.0 in float32 (ndtri(1) = inf, an infinite action
    and a NaN loss); the extreme hashes map strictly inside (0, 1), and the rest is the plain formula."""
    from rlinf_mini.utils.seeding import unit_float32

    h = numpy.array([0, (1 << 40) - 1, (1 << 64) - 1, ((1 << 24) - 2) << 40], dtype=numpy.uint64)
    u = unit_float32(h)
    assert (u > 0).all() and (u < 1).all() and torch.isfinite(torch.special.ndtri(torch.from_numpy(u))).all()
    plain = ((h >> numpy.uint64(40)).astype(numpy.float64) + 0.5) / 2 ** 24  # exact in float64
    assert u[0] == numpy.float32(plain[0]) and u[3] == numpy.float32(plain[3])  # the others are unchanged
    assert numpy.float32(plain[2]) == 1.0 and u[2] == numpy.nextafter(numpy.float32(1), numpy.float32(0))


def test_obs_norm_min_std_floors_the_std_a_still_dim_is_divided_by():
    """A plain reference: (x - mean) / sqrt(max(var, floor^2) + 1e-8), clipped to 10; a dim that never moved (var 0)
    is divided by the floor, not by sqrt(1e-8); a dim with more spread than the floor is untouched."""
    seen = torch.cat([torch.zeros(64, 1), torch.linspace(-1.0, 1.0, 64).unsqueeze(1)], dim=1)  # dim 0 still
    new = torch.tensor([[0.05, 0.5]])
    for floor in (0.0, 0.1):
        policy = build_policy(ModelConfig(hidden_dim=8, normalize_obs=True, obs_norm_min_std=floor), obs_dim=2,
                              action_dim=ACTION_DIM, discrete=False)
        policy.obs_normalizer.update(seen)
        mean, var = seen.double().mean(0), seen.double().var(0, correction=0)
        ref = ((new.double() - mean) / (var.clamp_min(floor ** 2) + 1e-8).sqrt()).clamp(-10, 10).float()
        assert torch.allclose(policy._normalize(new), ref, atol=1e-5)
    assert policy._normalize(new)[0, 0] == pytest.approx(0.5, abs=1e-3)  # 0.05 / 0.1, where no floor gives the clip
    assert policy.config["obs_norm_min_std"] == 0.1
