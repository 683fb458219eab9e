"""Policies, and `build_policy`, which makes one from the `actor.model` config section.

RLinf counterpart: `rlinf/models/__init__.py::get_model` (which also handles LoRA, precision and device placement;
here the caller moves the model). `model_type`: 'mlp_policy' (mlp_policy.py) or 'tiny_vla' (tiny_vla.py).
"""

from __future__ import annotations

from rlinf_mini.config import ModelConfig
from rlinf_mini.models.mlp_policy import MLPPolicy

__all__ = ["MLPPolicy", "build_policy"]


def build_policy(model_cfg: ModelConfig, obs_dim: int, action_dim: int, discrete: bool,
                 image_shape: tuple[int, ...] = (), temperature: float = 1.0):
    """Load `model_cfg.model_path` if set, else build a fresh policy; obs_dim/action_dim/discrete (and image_shape,
    for the VLA) come from the env; `temperature` is rollout.sampling_params.temperature_train (VLA only).

    Raises ValueError naming the config key when the model or the config disagrees with the env.
    """
    if model_cfg.model_type == "tiny_vla":
        from rlinf_mini.models.tiny_vla import build_tiny_vla

        return build_tiny_vla(model_cfg, obs_dim, action_dim, discrete, image_shape, temperature)
    if model_cfg.model_type != "mlp_policy":
        raise ValueError(f"actor.model.model_type: unknown model type {model_cfg.model_type!r} "
                         "(known: 'mlp_policy', 'tiny_vla')")
    for key, value, env_value in (("obs_dim", model_cfg.obs_dim, obs_dim),
                                  ("action_dim", model_cfg.action_dim, action_dim)):
        if value not in (0, env_value):  # 0 = "from the env"
            raise ValueError(f"actor.model.{key}: {value} does not match the env's {env_value}")
    if model_cfg.model_path:
        policy = MLPPolicy.from_pretrained(model_cfg.model_path)
        wanted = {"obs_dim": obs_dim, "action_dim": action_dim, "discrete": discrete,
                  "num_action_chunks": model_cfg.num_action_chunks}
        for key, value in wanted.items():
            if policy.config[key] != value:
                where = "actor.model.num_action_chunks" if key == "num_action_chunks" else "the env"
                raise ValueError(f"actor.model.model_path: {model_cfg.model_path!r} has {key}={policy.config[key]}, "
                                 f"but {where} has {value}")
        if model_cfg.normalize_obs != policy.config.get("normalize_obs", False):
            raise ValueError(f"actor.model.normalize_obs: {model_cfg.normalize_obs}, but {model_cfg.model_path!r} was "
                             f"saved with normalize_obs={policy.config.get('normalize_obs', False)}")
        if model_cfg.add_value_head and not policy.config["add_value_head"]:
            raise ValueError(f"actor.model.model_path: {model_cfg.model_path!r} has no value head, "
                             "but actor.model.add_value_head is true")
        return policy
    return MLPPolicy(obs_dim=obs_dim, action_dim=action_dim, discrete=discrete,
                     num_action_chunks=model_cfg.num_action_chunks, hidden_dim=model_cfg.hidden_dim,
                     add_value_head=model_cfg.add_value_head, normalize_obs=model_cfg.normalize_obs,
                     init_logstd=model_cfg.init_logstd, obs_norm_min_std=model_cfg.obs_norm_min_std)
