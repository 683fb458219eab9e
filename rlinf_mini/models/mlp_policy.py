"""MLPPolicy: the actor-critic that the rollout samples from and the actor trains.

    policy = MLPPolicy(obs_dim=4, action_dim=2, discrete=True, num_action_chunks=1)
    out = policy.predict_action_batch(obs, noise)       # rollout: {"actions", "logprobs", "values"}
    out = policy.default_forward(obs, out["actions"])   # actor: {"logprobs", "entropy", "values"}, with gradients

Inputs: obs [B, obs_dim]. Box actions: a Gaussian per action with a state-dependent mean (`actor_mean`) and a
state-independent log std (`actor_logstd`, initialised to `init_logstd`: RLinf's -0.5 by default); actions [B, C, A]
float32. Discrete actions (`action_dim` = the number of choices n): a categorical per chunk step (`actor_logits`);
actions [B, C] int64.
Logprobs and entropy are summed over the chunk and action dims, so one sample = one chunk step; the value head gives
one value per sample (RLinf's `chunk_level` value). The sampling noise comes from the caller (uniforms
from `rlinf_mini.utils.seeding.counter_uniform`), so the same (seed, env id, counter) gives the same action however
the envs are split over ranks or pipeline stages.

RLinf counterpart: `rlinf/models/embodiment/mlp_policy/mlp_policy.py::MLPPolicy` (`predict_action_batch`,
`default_forward`, `actor_mean`, `actor_logstd`) and `rlinf/models/embodiment/modules/value_head.py::ValueHead`.
Left out: the `forward(forward_type=...)` dispatch (callers name the method), the `forward_inputs` dict (the
trajectory stores obs and actions), the SAC twin-Q head, and RLinf's 3x256 width (ours: 2 x `hidden_dim`, CleanRL's
init).
Next: the rollout worker calls `predict_action_batch`; the actor calls `default_forward` in its PPO loss.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from rlinf_mini.models.hf_folder import write_folder_atomically
from rlinf_mini.utils.running_stats import ObsNormalizer

MODEL_TYPE = "mlp_policy"
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _layer(in_dim: int, out_dim: int, std: float) -> nn.Linear:
    """A Linear layer with CleanRL's init: orthogonal weights of gain `std`, zero bias."""
    layer = nn.Linear(in_dim, out_dim)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


def _backbone(in_dim: int, hidden_dim: int) -> nn.Sequential:
    return nn.Sequential(_layer(in_dim, hidden_dim, math.sqrt(2)), nn.Tanh(),
                         _layer(hidden_dim, hidden_dim, math.sqrt(2)), nn.Tanh())


class MLPPolicy(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, num_action_chunks: int = 1,
                 hidden_dim: int = 64, add_value_head: bool = True, normalize_obs: bool = False,
                 init_logstd: float = -0.5, obs_norm_min_std: float = 0.0):
        super().__init__()
        self.config = {"obs_dim": obs_dim, "action_dim": action_dim, "discrete": discrete,
                       "num_action_chunks": num_action_chunks, "hidden_dim": hidden_dim,
                       "add_value_head": add_value_head, "normalize_obs": normalize_obs,
                       "init_logstd": init_logstd, "obs_norm_min_std": obs_norm_min_std}  # saved in config.json
        self.obs_dim, self.action_dim, self.discrete = obs_dim, action_dim, discrete
        self.num_action_chunks = num_action_chunks
        out_dim = num_action_chunks * action_dim  # C*A (Box) or C*n (Discrete)
        # running obs statistics (buffers: synced, checkpointed); both heads read the normalised obs
        self.obs_normalizer = ObsNormalizer(obs_dim, obs_norm_min_std) if normalize_obs else None
        self.backbone = _backbone(obs_dim, hidden_dim)
        if discrete:
            self.actor_logits = _layer(hidden_dim, out_dim, 0.01)
        else:
            self.actor_mean = _layer(hidden_dim, out_dim, 0.01)
            self.actor_logstd = nn.Parameter(torch.full((out_dim,), float(init_logstd)))
        # A separate MLP, so the value loss does not shape the policy's features (CleanRL's agent does the same).
        self.value_head = (nn.Sequential(_backbone(obs_dim, hidden_dim), _layer(hidden_dim, 1, 1.0))
                           if add_value_head else None)

    # ---------------------------------------------------------------------------------------------------------------
    # The distribution: one code path for the rollout and the actor, so their logprobs agree bit for bit

    def _head(self, obs: Tensor) -> Tensor:
        """Box: the Gaussian means [B, C, A]; Discrete: the logits [B, C, n]."""
        features = self.backbone(self._normalize(obs))  # [B, hidden_dim]
        out = self.actor_logits(features) if self.discrete else self.actor_mean(features)  # [B, C*A]
        return out.reshape(-1, self.num_action_chunks, self.action_dim)  # [B, C, A]

    def _logprob_entropy(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probability of `actions` under the head's output `out`, and the entropy; both summed to [B]."""
        if self.discrete:
            logp_all = out.log_softmax(-1)  # [B, C, n]
            logprob = logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [B, C, 1] -> [B, C]
            entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, C]
        else:
            logstd = self.actor_logstd.reshape(self.num_action_chunks, self.action_dim).expand_as(out)  # [B, C, A]
            z = (actions - out) / logstd.exp()
            logprob = -0.5 * z.square() - logstd - _LOG_SQRT_2PI  # [B, C, A]
            entropy = 0.5 + _LOG_SQRT_2PI + logstd  # [B, C, A]
        return logprob.flatten(1).sum(-1), entropy.flatten(1).sum(-1)  # [B, C(, A)] -> [B]

    def _normalize(self, obs: Tensor) -> Tensor:
        return obs.float() if self.obs_normalizer is None else self.obs_normalizer(obs)  # [B, obs_dim] float32

    def _values(self, obs: Tensor) -> Tensor:
        if self.value_head is None:
            return obs.new_zeros(obs.shape[0], dtype=torch.float32)  # [B]
        return self.value_head(self._normalize(obs)).squeeze(-1)  # [B, 1] -> [B]

    # ---------------------------------------------------------------------------------------------------------------
    # Rollout and training entry points (RLinf's names)

    @property
    def noise_width(self) -> int:
        """Uniforms per sample: one per action dim (Box) or per choice (Discrete), for each chunk step."""
        return self.num_action_chunks * self.action_dim

    def prepare_inputs(self, obs: Tensor) -> Tensor:
        """The env's obs [B, obs_dim] is already the model's input (the VLA tokenizes here)."""
        return obs.to(next(self.parameters()).device)

    def predict_action_batch(self, obs: Tensor, noise: Tensor | None, mode: str = "train",
                             bootstrap_obs: Tensor | None = None) -> dict[str, Tensor]:
        """Sample (mode 'train') or pick the most likely (mode 'eval') actions for obs [B, obs_dim].

        noise: uniforms in (0, 1), [B, C*A] (Box) or [B, C*n] (Discrete); ignored in eval mode.
        bootstrap_obs: [B', obs_dim] whose values alone are wanted too (truncated episodes' final obs): the value
        head runs once over obs and them, and "bootstrap_values" [B'] is predict_values(bootstrap_obs).
        """
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        out = self._head(obs)  # [B, C, A] or [B, C, n]
        if mode == "eval":
            actions = out.argmax(-1) if self.discrete else out  # [B, C] or [B, C, A]
        else:
            expected = (out.shape[0], out.shape[1] * out.shape[2])
            if noise is None or tuple(noise.shape) != expected:
                got = None if noise is None else tuple(noise.shape)
                raise ValueError(f"mode 'train' needs noise of shape {expected} (uniforms in (0, 1)), got {got}")
            u = noise.reshape(out.shape)  # [B, C*A] -> [B, C, A]
            if self.discrete:  # Gumbel-max: argmax(logits + Gumbel noise) is a sample of the categorical
                actions = (out - torch.log(-torch.log(u))).argmax(-1)  # [B, C]
            else:  # inverse CDF: ndtri(u) is a standard normal
                std = self.actor_logstd.exp().reshape(self.num_action_chunks, self.action_dim)  # [C, A]
                actions = out + std * torch.special.ndtri(u)  # [B, C, A]
        logprobs, _ = self._logprob_entropy(out, actions)
        if bootstrap_obs is None:
            return {"actions": actions, "logprobs": logprobs, "values": self._values(obs)}
        values = self._values(torch.cat([obs, bootstrap_obs]))  # [B + B']: each row's value is its own
        return {"actions": actions, "logprobs": logprobs, "values": values[:len(obs)],
                "bootstrap_values": values[len(obs):]}

    def predict_values(self, obs: Tensor) -> Tensor:
        """The value head alone, [B], for obs [B, obs_dim]: the bootstrap value of a truncated episode's final obs
        (the same values predict_action_batch returns, without the action head and the sampling)."""
        return self._values(obs)

    def default_forward(self, obs: Tensor, actions: Tensor, compute_values: bool = True) -> dict[str, Tensor]:
        """Recompute logprobs [N], entropy [N] and values [N] of stored obs [N, obs_dim] and actions, with gradients."""
        logprobs, entropy = self._logprob_entropy(self._head(obs), actions)
        values = self._values(obs) if compute_values else obs.new_zeros(obs.shape[0], dtype=torch.float32)
        return {"logprobs": logprobs, "entropy": entropy, "values": values}

    def forward(self, obs: Tensor, actions: Tensor, compute_values: bool = True) -> dict[str, Tensor]:
        """`module(...)` is the training path (DistributedDataParallel hooks into forward)."""
        return self.default_forward(obs, actions, compute_values)

    def value_parameters(self) -> list[nn.Parameter]:
        """The value head's parameters (the optimizer gives them actor.optim.value_lr)."""
        return [] if self.value_head is None else list(self.value_head.parameters())

    # ---------------------------------------------------------------------------------------------------------------
    # HF-style folders: config.json + model.safetensors

    def save_pretrained(self, path: str | Path) -> None:
        """Write the folder `path` atomically: a crash leaves the old folder or the new one, never half of one."""

        def write(tmp: Path) -> None:
            (tmp / "config.json").write_text(json.dumps({**self.config, "model_type": MODEL_TYPE}, indent=2))
            tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})

        write_folder_atomically(path, write)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> MLPPolicy:
        path = Path(path)
        if not (path / "config.json").is_file():
            raise ValueError(f"{path}: not a model folder (no config.json)")
        config = json.loads((path / "config.json").read_text())
        model_type = config.pop("model_type", None)
        if model_type != MODEL_TYPE:
            raise ValueError(f"{path}/config.json: model_type is {model_type!r}, expected {MODEL_TYPE!r}")
        if not (path / "model.safetensors").is_file():
            raise ValueError(f"{path}: no model.safetensors")
        # The weights are loaded over the fresh init; fork the RNG so loading does not shift anyone's random stream.
        with torch.random.fork_rng(devices=[]):
            try:
                model = cls(**config)
            except TypeError as e:
                raise ValueError(f"{path}/config.json: {e}") from None
        try:
            model.load_state_dict(load_file(str(path / "model.safetensors")))
        except RuntimeError as e:
            raise ValueError(f"{path}/model.safetensors does not match config.json: {e}") from None
        return model
