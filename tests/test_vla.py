"""The pixel + language env, the tiny VLA, and the VLA path through the pipeline (fast: a 1-layer, 32-wide model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from rlinf_mini.config import EnvSplitConfig, InitParams, ModelConfig, VideoConfig
from rlinf_mini.envs import EnvSpec, get_env_spec, make_env
from rlinf_mini.envs.pixel_reach import COLORS, RGB
from rlinf_mini.envs.video import MIN_SIDE, TEXT_BAND, EvalVideoRecorder
from rlinf_mini.models import build_policy
from rlinf_mini.models.tiny_vla import TinyVLAConfig, TinyVLAPolicy, build_tokenizer
from rlinf_mini.utils.seeding import counter_uniform
from rlinf_mini.utils.tensor_tree import tree_cat, tree_map

G, P = 5, 4


def pixel_cfg(**kw) -> EnvSplitConfig:
    base = {"init_params": InitParams(id="PixelReach-v0", grid_size=G, cell_pixels=P), "max_episode_steps": 12}
    return EnvSplitConfig(**(base | kw))


def small_vla(chunks: int = 2, temperature: float = 1.0, seed: int = 0) -> TinyVLAPolicy:
    torch.manual_seed(seed)
    config = TinyVLAConfig(image_size=G * P, patch_size=P, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           num_action_chunks=chunks, state_dim=2)
    return TinyVLAPolicy(config, temperature=temperature)


def oracle_actions(env) -> torch.Tensor:
    """[B, 2]: the move towards the asked block (sign of the cell difference)."""
    return (env._target_cell() - env.agent).sign().to(torch.float32)


# --- the env ----------------------------------------------------------------------------------------------------------


def test_pixel_reach_obs_dict_and_spec():
    cfg = pixel_cfg()
    assert get_env_spec(cfg) == EnvSpec(obs_dim=2, action_dim=2, discrete=False, image_shape=(3, G * P, G * P))
    env = make_env(cfg, torch.arange(8), 1)
    obs = env.reset()
    assert obs["images"].dtype == torch.uint8 and obs["images"].shape == (8, 3, G * P, G * P)
    assert obs["states"].shape == (8, 2) and obs["states"].abs().max() <= 1
    assert set(obs["task_descriptions"]) <= {f"move to the {c} block" for c in COLORS}
    for b in range(8):  # each block's colour fills its cell; the agent's cell has white in the middle
        for i, color in enumerate(COLORS):
            r, c = env.blocks[b, i].tolist()
            assert obs["images"][b, :, r * P, c * P].tolist() == list(RGB[color])
        r, c = env.agent[b].tolist()
        assert obs["images"][b, :, r * P + P // 2, c * P + P // 2].tolist() == [255, 255, 255]
        assert len({tuple(env.agent[b].tolist()), *(tuple(x) for x in env.blocks[b].tolist())}) == 3


def test_pixel_reach_words_decide_the_right_action():
    """The same image needs different actions for the two instructions: an oracle that follows the words always
    succeeds; the same oracle told the other colour never succeeds on the asked block; ignoring words can't beat 1/2."""
    cfg = pixel_cfg(auto_reset=False)
    results = {}
    for swap in (False, True):
        env = make_env(cfg, torch.arange(256), 1)
        env.reset()
        success = torch.zeros(256, dtype=torch.bool)
        for _ in range(cfg.max_episode_steps):
            asked = env.target.clone()
            if swap:
                env.target = 1 - asked  # the policy is told the other block...
            a = oracle_actions(env)
            env.target = asked  # ...but success is judged on the asked one
            _, _, term, _, _ = env.chunk_step(a[:, None])
            success |= term[:, 0]
        results[swap] = success.float().mean().item()
    assert results[False] == 1.0
    assert results[True] < 0.1
    # same image, different words -> a different first move in most episodes
    env = make_env(cfg, torch.arange(256), 1)
    env.reset()
    a0 = oracle_actions(env)
    env.target = 1 - env.target
    assert (oracle_actions(env) != a0).any(dim=1).float().mean() > 0.6  # 0.74: both blocks may lie the same way


def test_pixel_reach_rewards_success_and_auto_reset():
    env = make_env(pixel_cfg(), torch.arange(16), 2)
    env.reset()
    returns = torch.zeros(16)
    successes = 0
    for _ in range(6):
        a = oracle_actions(env)
        obs, r, term, trunc, stats = env.chunk_step(torch.stack([a, a], dim=1))
        successes += int(term.sum())
        returns += r.sum(1)
        assert (r[term] > 1.0).all()  # success bonus + one cell of shaping
    assert successes >= 16  # every sub-env reached its block at least once (max distance 4 < 12 steps)
    assert len(stats["return"]) == int(term.any(1).sum())


def test_pixel_reach_split_invariance_groups_and_resume():
    cfg = pixel_cfg(group_size=4)
    whole = make_env(cfg, torch.arange(8), 1)
    halves = [make_env(cfg, torch.arange(0, 4), 1), make_env(cfg, torch.arange(4, 8), 1)]
    o = whole.reset()
    oh = [h.reset() for h in halves]
    assert torch.equal(o["images"], torch.cat([x["images"] for x in oh]))
    assert (o["images"][:4] == o["images"][0]).all() and not torch.equal(o["images"][0], o["images"][4])
    actions = torch.tensor([[[1.0, 0.0]]]).expand(8, 1, 2)
    whole.chunk_step(actions)
    state = whole.get_state()
    ref = [whole.chunk_step(actions) for _ in range(5)]
    other = make_env(cfg, torch.arange(8), 1)
    other.set_state(state)
    for want in ref:
        got = other.chunk_step(actions)
        assert torch.equal(got[0]["images"], want[0]["images"]) and torch.equal(got[1], want[1])


# --- the model --------------------------------------------------------------------------------------------------------


def _inputs(policy: TinyVLAPolicy, n: int = 16, seed: int = 0) -> dict:
    env = make_env(pixel_cfg(seed=seed), torch.arange(n), policy.num_action_chunks)
    return policy.prepare_inputs(env.reset())


def test_tokenizer_is_local_word_level_and_pads():
    tok = build_tokenizer()
    enc = tok(["move to the red block", "Move to the BLUE block"], padding="max_length", max_length=8)
    assert enc["input_ids"][0][:5] != enc["input_ids"][1][:5]
    assert enc["input_ids"][0][3] != enc["input_ids"][1][3] and enc["input_ids"][0][:3] == enc["input_ids"][1][:3]
    assert enc["attention_mask"][0] == [1] * 5 + [0] * 3 and enc["input_ids"][0][5:] == [0] * 3
    assert tok("move to the purple block")["input_ids"][3] == tok.unk_token_id


def test_from_pretrained_gives_identical_action_logits(tmp_path):
    policy = small_vla()
    inputs = _inputs(policy)
    policy.save_pretrained(tmp_path / "vla")
    files = {p.name for p in (tmp_path / "vla").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    assert json.loads((tmp_path / "vla" / "config.json").read_text())["model_type"] == "tiny_vla"
    loaded = TinyVLAPolicy.from_pretrained(tmp_path / "vla")
    assert torch.equal(loaded.action_logits(loaded.prepare_inputs(make_env(pixel_cfg(), torch.arange(16), 2).reset())),
                       policy.action_logits(inputs))
    other = small_vla(seed=1)  # a different init really gives different logits (the check above can fail)
    assert not torch.equal(other.action_logits(inputs), policy.action_logits(inputs))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_and_actor_logprobs_match(temperature):
    """The rollout samples in batches of 8 under no_grad; the actor recomputes the same tokens in a shuffled batch of
    all of them, in train mode, with gradients: log-probs agree to 1e-5."""
    policy = small_vla(temperature=temperature)
    outs = []
    with torch.no_grad():
        policy.eval()
        for part in range(3):
            env = make_env(pixel_cfg(seed=part), torch.arange(8 * part, 8 * part + 8), 2)
            noise = counter_uniform(5, env.env_ids, part, policy.noise_width)
            outs.append(policy.predict_action_batch(policy.prepare_inputs(env.reset()), noise, mode="train"))
    inputs = tree_cat([o["forward_inputs"] for o in outs])
    old = torch.cat([o["logprobs"] for o in outs])
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    policy.train()
    new = policy.default_forward(tree_map(lambda t: t[perm], inputs))
    assert (new["logprobs"] - old[perm]).abs().max() <= 1e-5
    new["logprobs"].sum().backward()  # the actor's path has gradients
    assert policy.vla.action_head.weight.grad is not None
    # the log-prob is the tempered one: sum over tokens of log_softmax(logits / T)
    logits = policy.action_logits(inputs)
    manual = (logits / temperature).log_softmax(-1).gather(-1, inputs["action_tokens"][..., None]).sum((1, 2))
    assert torch.allclose(manual, old, atol=1e-5)
    # tokens map to bin centres, C actions of A dims
    actions = torch.cat([o["actions"] for o in outs])
    assert actions.shape == (24, 2, 2)
    assert torch.equal(actions.reshape(24, -1), torch.linspace(-1, 1, 3)[inputs["action_tokens"]])


def test_sampling_follows_temperature_and_eval_is_argmax():
    policy = small_vla()
    with torch.no_grad():
        policy.vla.action_head.bias.copy_(torch.tensor([0.0, 1.0, 0.0]))  # skew the bins
        inputs = _inputs(policy, n=512)
        ids = torch.arange(512)
        freq = {}
        for t in (1.0, 0.3):
            policy.temperature = t
            toks = policy.predict_action_batch(inputs, counter_uniform(1, ids, 0, policy.noise_width))
            freq[t] = (toks["forward_inputs"]["action_tokens"] == 1).float().mean().item()
        policy.temperature = 1.0
        greedy = policy.predict_action_batch(inputs, None, mode="eval")["forward_inputs"]["action_tokens"]
    assert freq[0.3] > freq[1.0] + 0.1  # a lower temperature concentrates on the likely bin
    assert torch.equal(greedy, policy.action_logits(inputs).argmax(-1))


def test_build_policy_checks_the_folder_against_the_env(tmp_path):
    policy = small_vla()
    policy.save_pretrained(tmp_path / "vla")
    cfg = ModelConfig(model_type="tiny_vla", model_path=str(tmp_path / "vla"), num_action_chunks=2)
    loaded = build_policy(cfg, 2, 2, False, image_shape=(3, G * P, G * P), temperature=0.5)
    assert loaded.temperature == 0.5
    with pytest.raises(ValueError, match="num_action_chunks=2"):
        build_policy(ModelConfig(model_type="tiny_vla", model_path=str(tmp_path / "vla"), num_action_chunks=1),
                     2, 2, False, image_shape=(3, G * P, G * P))
    with pytest.raises(ValueError, match="needs an env with images"):
        build_policy(ModelConfig(model_type="tiny_vla"), 4, 2, False)


def test_make_tiny_vla_command(tmp_path):
    from rlinf_mini.models.make_tiny_vla import main

    assert main(["--out", str(tmp_path / "m"), "--config", "configs/embodied.yaml"]) == 0
    policy = TinyVLAPolicy.from_pretrained(tmp_path / "m")
    assert policy.config.num_action_chunks == 2 and policy.config.image_size == G * P
    assert main(["--out", str(tmp_path / "x"), "--config", "configs/nope.yaml"]) == 2


# --- eval video and learning curve ------------------------------------------------------------------------------------


def test_video_recorder_frames_text_and_stop(tmp_path):
    env = make_env(pixel_cfg(auto_reset=False), torch.arange(4), 1)
    obs = env.reset()
    rec = EvalVideoRecorder(VideoConfig(save_video=True, num_videos=2), env, obs)
    steps = 0
    for _ in range(12):
        obs, r, term, trunc, _ = env.chunk_step(oracle_actions(env)[:, None])
        rec.add(env, obs, r, term)
        steps += 1
    paths = rec.save(tmp_path, prefix="rank0")
    assert [p.name for p in paths] == ["rank0_env0.gif", "rank0_env1.gif"]
    for i, p in enumerate(paths):
        gif = Image.open(p)
        side = G * P * -(-MIN_SIDE // (G * P))
        assert gif.size == (side, side + TEXT_BAND)
        assert gif.n_frames == len(rec.frames[i]) and rec.success[i]
        assert 2 <= gif.n_frames <= 5  # the reset frame + one per step until success (the oracle needs <= 4)


VLA_RUN = {
    "runner": {"max_epochs": 1, "val_check_interval": 1, "save_interval": 1, "progress_bar": False},
    "env": {"train": {"init_params": {"id": "PixelReach-v0"}, "total_num_envs": 8, "max_steps_per_rollout_epoch": 8,
                      "max_episode_steps": 8},
            "eval": {"init_params": {"id": "PixelReach-v0"}, "total_num_envs": 8, "max_steps_per_rollout_epoch": 8,
                     "max_episode_steps": 8, "video_cfg": {"save_video": True, "num_videos": 2}}},
    "actor": {"global_batch_size": 16, "micro_batch_size": 8,
              "model": {"model_type": "tiny_vla", "num_action_chunks": 2, "hidden_dim": 32, "num_layers": 1}},
    "rollout": {"sampling_params": {"temperature_train": 0.9}},
}


@pytest.fixture(scope="module")
def vla_run(tmp_path_factory):
    """One step of the VLA through the whole pipeline (hybrid placement, 2 stages, 2 actor ranks)."""
    from conftest import write_config

    from rlinf_mini.train import main

    tmp = tmp_path_factory.mktemp("vla_run")
    sections = json.loads(json.dumps(VLA_RUN))
    sections["actor"]["model"]["model_path"] = str(tmp / "tiny_vla")
    cfg = write_config(tmp, **sections)
    rc = main(["--config", str(cfg)])
    return rc, tmp / "results" / "embodied", tmp


def test_vla_pipeline_trains_saves_video_and_learning_curve(vla_run):
    rc, run_dir, tmp = vla_run
    assert rc == 0
    assert (tmp / "tiny_vla" / "config.json").is_file()  # the entry created the initial model folder
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/success_once" in r]
    assert [r["step"] for r in evals] == [0, 1]
    assert all(r["train/actor/approx_kl"] < 0.5 for r in rows if "train/actor/approx_kl" in r)
    # the trained weights round-trip through the checkpoint's HF folder
    saved = TinyVLAPolicy.from_pretrained(run_dir / "checkpoints" / "global_step_1" / "actor" / "model")
    first = TinyVLAPolicy.from_pretrained(tmp / "tiny_vla")
    inputs = saved.prepare_inputs(make_env(pixel_cfg(), torch.arange(4), 2).reset())
    assert not torch.equal(saved.action_logits(inputs), first.action_logits(inputs))  # training changed them
    # videos: one gif per recorded sub-env per eval, playable, upscaled, <= 1 + chunk steps frames
    for step in (0, 1):
        gifs = sorted((run_dir / "videos" / f"step_{step}").glob("*.gif"))
        assert [g.name for g in gifs] == ["rank0_env0.gif", "rank0_env1.gif"]
        for g in gifs:
            img = Image.open(g)
            side = G * P * -(-MIN_SIDE // (G * P))  # upscaled by an integer factor to >= MIN_SIDE
            assert img.size == (side, side + TEXT_BAND)
            assert 1 <= img.n_frames <= 1 + 8 // 2
            img.seek(img.n_frames - 1)  # decodes every frame
    png = Image.open(run_dir / "learning_curve.png")
    assert png.format == "PNG" and png.size[0] >= 600 and png.size[1] >= 250


def test_learning_curve_needs_eval_rows(tmp_path):
    from rlinf_mini.utils.learning_curve import plot_learning_curve

    assert plot_learning_curve([{"step": 1, "env/return": 0.0}], tmp_path / "a.png") is None
    out = plot_learning_curve([{"step": 0, "eval/success_once": 0.1, "eval/return": 0.2},
                               {"step": 5, "eval/success_once": 0.9, "eval/return": 1.0}], tmp_path / "b.png")
    assert out is not None and Image.open(out).size == (900, 340)


def test_vla_config_errors(tmp_path):
    from conftest import write_config

    from rlinf_mini.train import main

    sections = json.loads(json.dumps(VLA_RUN))
    sections["actor"]["model"]["n_action_bins"] = 1
    assert main(["--config", str(write_config(tmp_path, **sections))]) == 2
    sections = json.loads(json.dumps(VLA_RUN))
    sections["env"]["train"]["init_params"]["id"] = "FakeReach-v0"  # no images: the VLA cannot read it
    sections["env"]["eval"]["init_params"]["id"] = "FakeReach-v0"
    sections["actor"]["model"]["model_path"] = str(tmp_path / "m")
    assert main(["--config", str(write_config(tmp_path, **sections))]) == 2
    assert not Path(tmp_path / "m").exists()
