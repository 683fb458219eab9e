"""Running mean and variance of a stream of batches, and ObsNormalizer: the policy's input normalisation built on it.

    mean, var, count = merge_moments(mean, var, count, batch.mean(0), batch.var(0, correction=0), len(batch))
    norm = ObsNormalizer(obs_dim=39)      # buffers: mean [39], var [39], count []
    norm.update(obs)                      # obs [N, 39]; the actor calls this once per training step
    x = norm(obs)                         # (obs - mean) / sqrt(var + 1e-8), clipped to [-10, 10]

The merge is Chan et al.'s parallel update (SB3's and gymnasium's RunningMeanStd): the moments of all the data seen
so far and those of a new batch combine into the moments of both, exactly (up to rounding), whatever the batch sizes.
The start (mean 0, var 1, count 1e-4) and the constants (epsilon 1e-8, clip 10) are SB3 VecNormalize's defaults.
ObsNormalizer keeps its statistics as buffers, so they are in the model's state_dict: the weight sync sends them to
the rollout with the weights, the checkpoint and the HF folder save them, and a resumed run restores them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

EPSILON = 1e-8  # added to the variance before the square root (SB3 VecNormalize's epsilon)
CLIP = 10.0  # normalised values are clipped to [-CLIP, CLIP] (SB3's clip_obs and clip_reward)
START_COUNT = 1e-4  # the prior's weight: the first batch all but replaces mean 0, var 1


def merge_moments(mean: Tensor, var: Tensor, count: Tensor | float, batch_mean: Tensor, batch_var: Tensor,
                  batch_count: Tensor | float) -> tuple[Tensor, Tensor, Tensor | float]:
    """The mean, (population) variance and count of the data behind (mean, var, count) and a batch's moments together.
    Shapes broadcast: [D] for a vector statistic, [B] for one per sub-env, [] for one scalar."""
    total = count + batch_count
    delta = batch_mean - mean
    new_mean = mean + delta * (batch_count / total)
    m2 = var * count + batch_var * batch_count + delta.square() * (count * batch_count / total)
    return new_mean, m2 / total, total


class ObsNormalizer(nn.Module):
    """Normalises observations [N, D] with the running moments of every observation it was updated with."""

    def __init__(self, obs_dim: int, min_std: float = 0.0):
        super().__init__()
        self.min_std = min_std  # a floor on the std divided by (0: SB3's, none): a dim that never moved stays small
        # float64: a million updates in float32 drift; the sync and the checkpoint carry float64 as they carry any dtype
        self.register_buffer("mean", torch.zeros(obs_dim, dtype=torch.float64))  # [D]
        self.register_buffer("var", torch.ones(obs_dim, dtype=torch.float64))  # [D]
        self.register_buffer("count", torch.tensor(START_COUNT, dtype=torch.float64))  # []

    def forward(self, obs: Tensor) -> Tensor:
        """[N, D] -> [N, D] float32, (obs - mean) / sqrt(max(var, min_std^2) + EPSILON) clipped to [-CLIP, CLIP]."""
        scale = (self.var.clamp_min(self.min_std ** 2) + EPSILON).rsqrt().to(torch.float32)
        return ((obs.float() - self.mean.to(torch.float32)) * scale).clamp(-CLIP, CLIP)

    @torch.no_grad()
    def update_from_moments(self, batch_mean: Tensor, batch_var: Tensor, batch_count: float) -> None:
        """Merge a batch's moments [D], [D] and size (all ranks' data: the caller all-reduces the sums first)."""
        mean, var, count = merge_moments(self.mean, self.var, self.count, batch_mean.to(self.mean),
                                         batch_var.to(self.var), float(batch_count))
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)

    def update(self, obs: Tensor) -> None:
        """Merge the observations obs [N, D] of one process (ActorWorker all-reduces instead: moments_of + sums)."""
        obs = obs.to(torch.float64)
        self.update_from_moments(obs.mean(0), obs.var(0, correction=0), obs.shape[0])


def moment_sums(x: Tensor) -> Tensor:
    """x [N, D] -> [2D + 1] float64: the per-dim sums, sums of squares and N, which add up across ranks."""
    x = x.to(torch.float64)
    return torch.cat([x.sum(0), x.square().sum(0), x.new_tensor([x.shape[0]])])


def moments_from_sums(sums: Tensor) -> tuple[Tensor, Tensor, float]:
    """moment_sums (added over ranks) -> (mean [D], population var [D], N)."""
    d = (sums.numel() - 1) // 2
    n = float(sums[-1])
    mean = sums[:d] / n
    return mean, (sums[d:2 * d] / n - mean.square()).clamp_min(0.0), n


class ReturnScaler:
    """Scales each sub-env's rewards by the running std of its discounted return (SB3 VecNormalize's norm_reward,
    per sub-env as CleanRL's gymnasium.wrappers.NormalizeReward): the scale of the value targets stays near 1 whatever
    the env's reward units, and it is the same however the sub-envs are split over ranks and pipeline stages."""

    def __init__(self, num_envs: int, gamma: float):
        self.gamma = gamma
        self.ret = torch.zeros(num_envs, dtype=torch.float64)  # [B] discounted return of the running episode
        self.mean = torch.zeros(num_envs, dtype=torch.float64)  # [B] moments of each sub-env's `ret` values
        self.var = torch.ones(num_envs, dtype=torch.float64)
        self.count = torch.full((num_envs,), START_COUNT, dtype=torch.float64)

    def __call__(self, rewards: Tensor, dones: Tensor) -> Tensor:
        """rewards [B, C] (one chunk), dones [B, C] bool -> scaled rewards [B, C] float32. Per sub-step: accumulate
        the return, merge it into the moments, divide the reward by sqrt(var + 1e-8), clip, zero the return at done."""
        out = torch.empty(rewards.shape, dtype=torch.float32)
        zeros = torch.zeros_like(self.ret)
        for c in range(rewards.shape[1]):
            r = rewards[:, c].to(torch.float64)
            self.ret = self.ret * self.gamma + r
            self.mean, self.var, self.count = merge_moments(self.mean, self.var, self.count, self.ret, zeros, 1.0)
            out[:, c] = (r / (self.var + EPSILON).sqrt()).clamp(-CLIP, CLIP)
            self.ret = self.ret.masked_fill(dones[:, c], 0.0)
        return out

    def state_dict(self) -> dict[str, Tensor]:
        return {"ret": self.ret.clone(), "mean": self.mean.clone(), "var": self.var.clone(),
                "count": self.count.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state["ret"].shape != self.ret.shape:
            raise ValueError(f"ReturnScaler: the state is for {state['ret'].shape[0]} sub-envs, this stage has "
                             f"{self.ret.shape[0]}")
        self.ret, self.mean, self.var, self.count = (state[k].clone() for k in ("ret", "mean", "var", "count"))
