"""Stage 5 — train: the actor turns trajectories into a PPO (or GRPO) update, data-parallel over its ranks.

    actor.recv_rollout_trajectories(actor_channel)   # its pieces of the batch: obs [T, B, D], ..., values [T+1, B]
    actor.compute_advantages_and_returns()           # stage 4 on this rank's columns; whitened over all ranks
    actor.run_training()                             # calls update_policy: epochs -> global batches -> micro-batches

`update_policy(policy, optimizer, flat, cfg, ...)`: the update as a plain function over flat tensors [N, ...]; one
optimizer step per global_batch_size / W samples per rank, micro-batch gradients added up, then with W > 1 ranks one
all-reduce of the flat gradient (`Worker.all_reduce`: DDP without its wrapper). Losses: `stages/losses.py`.
RLinf counterpart: `rlinf/workers/actor/fsdp_actor_worker.py::EmbodiedFSDPActor` (recv_rollout_trajectories,
compute_advantages_and_returns, run_training, train_micro_batch). The update loop, the gradient all-reduce and the
weight sync are the actor core's (`stages/actor_core.py`), shared with the reasoning actor, as is the lr schedule
(actor.optim.lr_scheduler: warmup, then constant or cosine). Left out: FSDP, LoRA, offload.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable

import torch

from rlinf_mini.config import TrainConfig
from rlinf_mini.envs import get_env_spec
from rlinf_mini.models import build_policy
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.utils.precision import autocast
from rlinf_mini.utils.running_stats import moment_sums, moments_from_sums
from rlinf_mini.utils.tensor_tree import tree_cat, tree_map
from stages.actor_core import ActorCore, NonFiniteError, build_lr_scheduler, raise_if_not_finite, update_loop
from stages.advantages import calculate_adv_and_returns, first_episode_mask
from stages.losses import (
    compute_decoupled_ppo_actor_loss,
    compute_ppo_actor_loss,
    compute_ppo_critic_loss,
    kl_penalty,
    masked_mean,
)
from stages.placement import actor_pieces
from stages.sync import WeightSender

__all__ = ["ActorWorker", "NonFiniteError", "compute_micro_batch_loss", "compute_ppo_actor_loss",
           "compute_ppo_critic_loss", "flatten_batch", "masked_mean", "update_policy"]  # NonFiniteError: actor_core


def flatten_batch(batch: dict) -> dict:
    """A rollout batch [T, B, ...] (after stage 4) -> the flat samples [N = T * B, ...] that update_policy trains on;
    obs may be a dict (the VLA's images, token ids, action tokens)."""
    T, B = batch["rewards"].shape
    flat = {
        "obs": tree_map(lambda t: t.reshape(T * B, *t.shape[2:]), batch["obs"]),
        "actions": batch["actions"].reshape(T * B, *batch["actions"].shape[2:]),
        "old_logprobs": batch["logprobs"].reshape(-1),
        "old_values": batch["values"][:T].reshape(-1),
        "advantages": batch["advantages"].reshape(-1),
        "returns": batch["returns"].reshape(-1),
        "loss_mask": batch["loss_mask"].reshape(-1).float(),
    }
    for name in ("ref_logprobs", "proximal_logprobs", "versions"):  # versions [T, B]: the weights that acted
        if name in batch:
            flat[name] = batch[name].reshape(-1)
    return flat


def compute_micro_batch_loss(policy: torch.nn.Module, mb: dict, cfg: TrainConfig, current_version: int | None = None
                             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """loss = pg_loss - entropy_bonus * entropy + value_loss_coef * v_loss + kl_beta * kl, on one micro-batch [n].
    With loss_type decoupled_actor_critic, pg_loss is async PPO's (docs/async_ppo.md): the proximal log-probs are
    mb["proximal_logprobs"] when the actor recomputed them, else interpolated from mb["versions"] and
    `current_version` (the version this update makes)."""
    algo = cfg.algorithm
    use_critic = algo.loss_type in ("actor_critic", "decoupled_actor_critic")
    with autocast(cfg.actor.model.precision, next(policy.parameters()).device):  # bf16 on a GPU when asked
        out = policy.default_forward(mb["obs"], mb["actions"], compute_values=use_critic)
    out = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in out.items()}
    if algo.loss_type == "decoupled_actor_critic":
        pg_loss, metrics = compute_decoupled_ppo_actor_loss(
            out["logprobs"], mb["old_logprobs"], mb["advantages"], mb["loss_mask"], algo.clip_ratio_low,
            algo.clip_ratio_high, algo.clip_ratio_c, proximal_logprobs=mb.get("proximal_logprobs"),
            versions=mb["versions"], current_version=current_version,
            behave_weight_threshold=algo.behave_weight_threshold)
    else:
        pg_loss, metrics = compute_ppo_actor_loss(out["logprobs"], mb["old_logprobs"], mb["advantages"],
                                                  mb["loss_mask"], algo.clip_ratio_low, algo.clip_ratio_high,
                                                  algo.clip_ratio_c)
    entropy = masked_mean(out["entropy"], mb["loss_mask"])
    loss = pg_loss - algo.entropy_bonus * entropy
    metrics |= {"actor/policy_loss": pg_loss.detach(), "actor/entropy_loss": entropy.detach()}
    if use_critic:
        v_loss, v_metrics = compute_ppo_critic_loss(out["values"], mb["old_values"], mb["returns"], mb["loss_mask"],
                                                    algo.value_clip, algo.huber_delta)
        loss = loss + algo.value_loss_coef * v_loss
        metrics |= v_metrics | {"critic/value_loss": v_loss.detach()}
    if algo.kl_beta > 0:
        kl = masked_mean(kl_penalty(out["logprobs"], mb["ref_logprobs"], algo.kl_penalty_type), mb["loss_mask"])
        loss = loss + algo.kl_beta * kl
        metrics["actor/kl_loss"] = kl.detach()
    metrics["actor/total_loss"] = loss.detach()
    return loss, metrics


def update_policy(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, flat: dict, cfg: TrainConfig, *,
                  global_step: int = 0, rank: int = 0, world_size: int = 1,
                  average_gradients: Callable[[], None] = lambda: None,
                  step_is_finite: Callable[[bool, float, str], bool] = raise_if_not_finite,
                  lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                  current_version: int | None = None) -> tuple[dict[str, float], int]:
    """`update_epoch` passes over this rank's flat samples [N, ...] (stages/actor_core.py::update_loop), with
    compute_micro_batch_loss on each micro-batch. Returns (this rank's mean of every metric over the steps taken,
    the number of steps skipped)."""

    def loss_fn(model: torch.nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mb = {k: tree_map(lambda t: t[idx], v) for k, v in flat.items()}  # [n_mb, ...]
        return compute_micro_batch_loss(model, mb, cfg, current_version)

    return update_loop(policy, optimizer, flat["advantages"].shape[0], loss_fn, cfg.actor,
                       update_epoch=cfg.algorithm.update_epoch, global_step=global_step, rank=rank,
                       world_size=world_size, average_gradients=average_gradients, step_is_finite=step_is_finite,
                       lr_scheduler=lr_scheduler)


class ActorWorker(ActorCore):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.global_step = 0

    def init_worker(self, world_sizes: dict[str, int]) -> None:
        """Join the data-parallel group, build the model (identical on every rank) and the optimizer."""
        self.world_sizes = world_sizes
        if self._world_size > 1:
            self.init_collective(self.cfg.cluster.timeout_s)
        spec = get_env_spec(self.cfg.env.train)
        torch.manual_seed(self.cfg.actor.seed)  # same seed on every rank: identical initial weights
        self.policy = build_policy(self.cfg.actor.model, spec.obs_dim, spec.action_dim, spec.discrete, spec.image_shape,
                                   self.cfg.rollout.sampling_params.temperature_train).to(self.device)
        self.model = self.policy  # the name the actor core trains and syncs
        optim = self.cfg.actor.optim
        value_ids = {id(p) for p in self.policy.value_parameters()}
        groups = [{"params": [p for p in self.policy.parameters() if id(p) not in value_ids], "lr": optim.lr}]
        if value_ids:
            groups.append({"params": self.policy.value_parameters(), "lr": optim.value_lr})
        self.optimizer = torch.optim.AdamW(groups, betas=(optim.adam_beta1, optim.adam_beta2), eps=optim.adam_eps,
                                           weight_decay=optim.weight_decay)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim)
        self.sender = WeightSender() if self._rank == 0 else None
        algo = self.cfg.algorithm  # the reference policy of the KL penalties: the initial weights, frozen
        wants_ref = algo.kl_beta > 0 or (algo.adv_type == "reinpp" and algo.reinpp_kl_beta > 0)
        self.ref_policy = copy.deepcopy(self.policy).eval().requires_grad_(False) if wants_ref else None

    def set_global_step(self, step: int) -> None:
        self.global_step = step

    def recv_rollout_trajectories(self, actor_channel: Channel) -> int:
        """Take this rank's pieces of the global batch (in piece order) and stack them along the env axis."""
        per_env, per_actor = actor_pieces(self.world_sizes["env"], self._world_size)
        pieces = []
        for p in range(self._rank * per_actor, (self._rank + 1) * per_actor):
            pieces.append(actor_channel.get(key=("traj", p),
                                            expected_from=f"{self.cfg.env.group_name} rank {p // per_env}"))
        self.batch = {name: tree_map(lambda t: t.to(self.device), tree_cat([pc[name] for pc in pieces], dim=1))
                      for name in pieces[0]}
        return self.batch["rewards"].shape[1]

    def compute_advantages_and_returns(self) -> dict[str, float]:
        """Advantages [T, B] on this rank's columns, whitened with statistics over every actor rank."""
        cfg, b = self.cfg, self.batch
        if self.ref_policy is not None:  # the reference policy's log-probs of the sampled actions, [T, B]
            flat_obs = tree_map(lambda t: t.reshape(-1, *t.shape[2:]), b["obs"])
            with torch.no_grad():
                ref = self.ref_policy.default_forward(flat_obs, b["actions"].reshape(-1, *b["actions"].shape[2:]),
                                                      compute_values=False)["logprobs"]
            b["ref_logprobs"] = ref.view_as(b["logprobs"])
        kl = (kl_penalty(b["logprobs"], b["ref_logprobs"], cfg.algorithm.kl_penalty_type)
              if "ref_logprobs" in b else None)
        gae_mask = None if cfg.env.train.auto_reset else first_episode_mask(b["dones"])  # RLinf's compute_loss_mask
        values = b["values"] if cfg.actor.model.add_value_head else None  # None: critic-free GAE
        out = calculate_adv_and_returns(cfg.algorithm, b["rewards"], values, b["dones"], all_reduce=self.all_reduce,
                                        kl=kl, loss_mask=gae_mask)
        adv = out["advantages"]
        b["advantages"], b["returns"], b["loss_mask"] = adv, out["returns"], out["loss_mask"]
        sums = self.all_reduce(torch.stack([b["rewards"].sum(), adv.sum(), out["returns"].sum(),
                                             torch.tensor(float(adv.numel()), device=adv.device)]))
        return {"rollout/rewards": (sums[0] / sums[3]).item(), "rollout/advantages": (sums[1] / sums[3]).item(),
                "rollout/returns": (sums[2] / sums[3]).item(),
                "rollout/staleness": float(self.global_step - b["versions"].float().mean().item())}

    def run_training(self) -> dict[str, float]:
        """`update_epoch` passes over this rank's samples (update_policy); metrics averaged over the ranks."""
        if self.cfg.actor.train_latency_s > 0:  # an update on a GPU, emulated (benchmarks/async_ppo.py)
            time.sleep(self.cfg.actor.train_latency_s)
        flat = flatten_batch(self.batch)
        lr = self.lr_scheduler.get_last_lr()[0]  # the schedule's rate as this step's update begins
        means, skipped = update_policy(self.policy, self.optimizer, flat, self.cfg, global_step=self.global_step,
                                       rank=self._rank, world_size=self._world_size,
                                       average_gradients=self._average_gradients, step_is_finite=self._step_is_finite,
                                       lr_scheduler=self.lr_scheduler,
                                       current_version=self.global_step + 1)  # async PPO's v_theta (losses.py)
        if self.cfg.actor.model.normalize_obs:  # after the update: the rollout's next obs meet the new statistics
            sums = self.all_reduce(moment_sums(flat["obs"]))  # [2D + 1] over every actor rank's samples
            self.policy.obs_normalizer.update_from_moments(*moments_from_sums(sums))
        keys = sorted(means)
        result = torch.tensor([means[k] for k in keys], dtype=torch.float32, device=self.device)  # nccl: on the GPU
        result = self.all_reduce(result) / self._world_size
        out = {f"train/{k}": float(v) for k, v in zip(keys, result, strict=True)}
        out["train/lr"] = lr
        if self.cfg.actor.skip_nonfinite:
            out["train/skipped_steps"] = float(skipped)
        y, v = flat["returns"], flat["old_values"]
        var_y = y.var()
        out["train/critic/explained_variance"] = float(1 - (y - v).var() / var_y) if var_y > 0 else float("nan")
        return out

    # --- checkpoints -------------------------------------------------------------------------------------------------

    def save_checkpoint(self, folder: str) -> None:
        """Rank 0 writes model and optimizer into `folder` (the runner makes the folder appear atomically)."""
        if self._rank != 0:
            return
        if not all(bool(torch.isfinite(p).all()) for p in self.policy.parameters()):
            raise NonFiniteError(f"step {self.global_step}: the parameters hold NaN/inf; no checkpoint written")
        os.makedirs(folder, exist_ok=True)
        torch.save({"model": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "lr_scheduler": self.lr_scheduler.state_dict()}, os.path.join(folder, "actor.pt"))
        self.policy.save_pretrained(os.path.join(folder, "model"))

    def load_checkpoint(self, folder: str) -> None:
        state = torch.load(os.path.join(folder, "actor.pt"), map_location=self.device, weights_only=True)
        self.policy.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])

    def get_rollout_batch(self) -> dict[str, torch.Tensor]:
        """This rank's trajectories (and, after stage 4, advantages): for tests and tutorials."""
        return {k: tree_map(lambda t: t.detach().cpu().clone(), v) for k, v in self.batch.items()}
