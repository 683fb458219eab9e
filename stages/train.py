"""Stage 5 — train: the actor turns trajectories into a PPO (or GRPO) update, data-parallel over its ranks.

    actor.recv_rollout_trajectories(actor_channel)   # its pieces of the batch: obs [T, B, D], ..., values [T+1, B]
    actor.compute_advantages_and_returns()           # stage 4 on this rank's columns; normalized over all ranks
    actor.run_training()                             # update_epoch passes; global batch -> micro-batches -> step

Batch arithmetic (checked before any worker starts, `config.check_batch_arithmetic`): the rollout batch has
N = total_num_envs x rollout_epoch x T samples (one per chunk step); each actor rank holds N / W_actor of them. One
optimizer step consumes `global_batch_size` samples over all ranks: global / W per rank, fed in micro-batches of
`micro_batch_size`, whose gradients accumulate (loss / accumulation steps) before the step. With W > 1 the ranks
average their gradients before each step with one all-reduce of the flat gradient (`Worker.all_reduce`: gloo on CPU,
NCCL on GPU, in-process threads on the inline backend) — what DistributedDataParallel does, without its wrapper.

Losses (PPO, Schulman et al. 2017; dual clip, Ye et al. 2020, https://arxiv.org/abs/1912.09729):
    ratio = exp(logp - old_logp)
    pg_loss  = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))
               and, where A < 0, min(that, -A * clip_ratio_c)            (dual clip: caps the loss of a huge ratio)
    v_loss   = 0.5 * max((V - R)^2, (V_clipped - R)^2),  V_clipped = V_old + clip(V - V_old, -value_clip, value_clip)
    loss     = pg_loss + value_loss_coef * v_loss - entropy_bonus * entropy      (loss_type "actor": no v_loss)

RLinf counterpart: `rlinf/workers/actor/embodied_fsdp_actor_worker.py::EmbodiedFSDPActor` (recv_rollout_trajectories,
compute_advantages_and_returns, run_training, sync_model_to_rollout) and `rlinf/algorithms/losses.py`
(`compute_ppo_actor_loss`, `compute_critic_loss`). Left out: FSDP sharding, LoRA, offload, LR schedules, KL penalty.
"""

from __future__ import annotations

import math
import os
import time

import torch

from rlinf_mini.config import TrainConfig
from rlinf_mini.envs import get_env_spec
from rlinf_mini.models import build_policy
from rlinf_mini.scheduler import faults
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.tracer import span
from rlinf_mini.scheduler.worker import Worker
from rlinf_mini.utils.precision import autocast
from rlinf_mini.utils.tensor_tree import tree_cat, tree_map
from stages.advantages import calculate_adv_and_returns
from stages.rollout import actor_pieces
from stages.sync import WeightBufferHandle, WeightSender


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def compute_ppo_actor_loss(logprobs, old_logprobs, advantages, loss_mask, clip_ratio_low: float,
                           clip_ratio_high: float, clip_ratio_c: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate with dual clip. All inputs [N]; loss_mask [N] float (1 = counts)."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    with torch.no_grad():
        metrics = {
            "actor/ratio": masked_mean(ratio, loss_mask),
            "actor/approx_kl": masked_mean((ratio - 1) - log_ratio, loss_mask),  # http://joschu.net/blog/kl-approx.html
            "actor/clip_fraction": masked_mean((pg_losses2 > pg_losses1).float(), loss_mask),
            "actor/dual_clip_fraction": masked_mean(((clip_pg_losses1 > pg_losses3) & (advantages < 0)).float(),
                                                    loss_mask),
        }
    return masked_mean(pg_losses, loss_mask), metrics


def compute_critic_loss(values, old_values, returns, loss_mask, value_clip: float
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss. All inputs [N]. value_clip <= 0 turns the clipping off (SB3's default)."""
    if value_clip <= 0:
        value_clip = float("inf")
    values_clipped = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
    v_losses = torch.maximum((values - returns) ** 2, (values_clipped - returns) ** 2)
    with torch.no_grad():
        metrics = {"critic/value_clip_ratio": masked_mean(((values - old_values).abs() > value_clip).float(),
                                                          loss_mask)}
    return 0.5 * masked_mean(v_losses, loss_mask), metrics


class NonFiniteError(FloatingPointError):
    """A NaN or inf in the loss or the gradients: the step is not taken (and no checkpoint holds it)."""


class ActorWorker(Worker):
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
        optim = self.cfg.actor.optim
        value_ids = {id(p) for p in self.policy.value_parameters()}
        groups = [{"params": [p for p in self.policy.parameters() if id(p) not in value_ids], "lr": optim.lr}]
        if value_ids:
            groups.append({"params": self.policy.value_parameters(), "lr": optim.value_lr})
        self.optimizer = torch.optim.AdamW(groups, betas=(optim.adam_beta1, optim.adam_beta2), eps=optim.adam_eps,
                                           weight_decay=optim.weight_decay)
        self.sender = WeightSender() if self._rank == 0 else None

    def set_global_step(self, step: int) -> None:
        self.global_step = step

    def sync_model_to_rollout(self, handles: list[WeightBufferHandle], version: int) -> dict[str, float]:
        """Rank 0 writes its weights into every rollout rank's buffer (the others hold the same weights)."""
        if self.sender is None:
            return {}
        start = time.monotonic()
        nbytes = self.sender.send(self.policy, handles, version)
        seconds = time.monotonic() - start
        return {"sync/bytes": float(nbytes), "sync/seconds": seconds, "sync/GBps": nbytes / max(seconds, 1e-9) / 1e9}

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
        """Advantages [T, B] on this rank's columns; GAE advantages are whitened over all ranks' samples."""
        algo, b = self.cfg.algorithm, self.batch
        normalize_here = algo.adv_type == "gae" and algo.normalize_advantages
        values = b["values"] if self.cfg.actor.model.add_value_head else None
        out = calculate_adv_and_returns(algo, b["rewards"], values, b["dones"], normalize=False)
        adv, mask = out["advantages"], out["loss_mask"].float()
        if normalize_here:  # global mean/std: identical whether 1 or 2 ranks hold the samples
            stats = self.all_reduce(torch.stack([(adv * mask).sum(), (adv**2 * mask).sum(), mask.sum()]))
            mean = stats[0] / stats[2]
            std = (stats[1] / stats[2] - mean**2).clamp(min=0).sqrt()
            adv = (adv - mean) / (std + 1e-8) * mask
        b["advantages"], b["returns"], b["loss_mask"] = adv, out["returns"], mask
        sums = self.all_reduce(torch.stack([b["rewards"].sum(), adv.sum(), out["returns"].sum(),
                                             torch.tensor(float(adv.numel()), device=adv.device)]))
        return {"rollout/rewards": (sums[0] / sums[3]).item(), "rollout/advantages": (sums[1] / sums[3]).item(),
                "rollout/returns": (sums[2] / sums[3]).item(),
                "rollout/staleness": float(self.global_step - b["versions"].float().mean().item())}

    def run_training(self) -> dict[str, float]:
        """`update_epoch` passes over this rank's samples, in minibatches of global_batch_size / W."""
        cfg, algo, b = self.cfg.actor, self.cfg.algorithm, self.batch
        T, B = b["rewards"].shape
        flat = {  # [T, B, ...] -> [N, ...], N = T * B; obs may be a dict (the VLA's images, token ids, action tokens)
            "obs": tree_map(lambda t: t.reshape(T * B, *t.shape[2:]), b["obs"]),
            "actions": b["actions"].reshape(T * B, *b["actions"].shape[2:]),
            "old_logprobs": b["logprobs"].reshape(-1),
            "old_values": b["values"][:T].reshape(-1),
            "advantages": b["advantages"].reshape(-1),
            "returns": b["returns"].reshape(-1),
            "loss_mask": b["loss_mask"].reshape(-1),
        }
        n = T * B
        per_rank_batch = cfg.global_batch_size // self._world_size
        accum = per_rank_batch // cfg.micro_batch_size
        totals: dict[str, float] = {}
        count, skipped = 0, 0
        self.policy.train()
        for epoch in range(algo.update_epoch):
            # the shuffle depends on (seed, step, epoch, rank) only: a resumed run shuffles the same way
            seed = ((cfg.seed * 1_000_003 + self.global_step) * 1009 + epoch) * 101 + self._rank
            gen = torch.Generator().manual_seed(seed)
            perm = torch.randperm(n, generator=gen)
            for start in range(0, n, per_rank_batch):
                mb_idx = perm[start : start + per_rank_batch]
                self.optimizer.zero_grad(set_to_none=True)
                step_metrics: list[tuple[str, float]] = []  # this optimizer step's; dropped if it is skipped
                loss_finite = True
                for m in range(accum):
                    idx = mb_idx[m * cfg.micro_batch_size : (m + 1) * cfg.micro_batch_size]
                    mb = {k: tree_map(lambda t, i=idx: t[i], v) for k, v in flat.items()}
                    with span("forward_backward"):
                        loss, metrics = self._micro_batch_loss(mb)
                        loss = faults.poison(loss)  # NaN only while an injected kind=nan fault fires
                        loss_finite = loss_finite and bool(torch.isfinite(loss))
                        (loss / accum).backward()
                    step_metrics += [(k, float(v)) for k, v in metrics.items()]
                self._average_gradients()
                grad_norm = (torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.optim.clip_grad)
                             if cfg.optim.clip_grad > 0 else _grad_norm(self.policy))
                if not self._step_is_finite(loss_finite, float(grad_norm), f"update epoch {epoch}, sample {start}"):
                    skipped += 1
                    continue
                step_metrics.append(("actor/grad_norm", float(grad_norm) * accum))
                for k, v in step_metrics:
                    totals[k] = totals.get(k, 0.0) + v
                count += accum
                with span("optimizer_step"):
                    self.optimizer.step()
        result = torch.tensor([totals[k] / count for k in sorted(totals)], dtype=torch.float32,
                              device=self.device)  # nccl: on the GPU
        result = self.all_reduce(result) / self._world_size
        out = {f"train/{k}": float(v) for k, v in zip(sorted(totals), result, strict=True)}
        out["train/lr"] = cfg.optim.lr
        if cfg.skip_nonfinite:
            out["train/skipped_steps"] = float(skipped)
        y, v = flat["returns"], flat["old_values"]
        var_y = y.var()
        out["train/critic/explained_variance"] = float(1 - (y - v).var() / var_y) if var_y > 0 else float("nan")
        return out

    def _average_gradients(self) -> None:
        """Mean of the ranks' gradients, in place: one all-reduce of all gradients flattened into one vector.
        Parameters without a gradient (the value head with loss_type 'actor') have none on every rank."""
        if self._world_size == 1:
            return
        grads = [p.grad for p in self.policy.parameters() if p.grad is not None]
        with span("grad_all_reduce"):
            flat = self.all_reduce(torch.cat([g.reshape(-1) for g in grads])) / self._world_size  # [P]
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def _step_is_finite(self, loss_finite: bool, grad_norm: float, where: str) -> bool:
        """Every rank agrees (one all-reduce) whether any rank saw a non-finite loss or gradient norm. Then raise
        NonFiniteError naming the step and the ranks, or, with actor.skip_nonfinite, drop the gradients and skip."""
        # [W]: 2 where that rank's own loss was NaN/inf, 1 where only its gradients were (DDP spreads a NaN gradient
        # to every rank, so the loss flag tells where it came from)
        bad = torch.zeros(self._world_size, device=self.device)
        bad[self._rank] = 2.0 if not loss_finite else float(not math.isfinite(grad_norm))
        bad = self.all_reduce(bad)
        if not bad.any():
            return True
        what = "loss" if (bad == 2).any() else "gradient norm"
        ranks = (bad == bad.max()).nonzero().flatten().tolist()
        msg = (f"non-finite {what} at global step {self.global_step} ({where}) on {self._group_name} rank(s) {ranks}")
        if not self.cfg.actor.skip_nonfinite:
            raise NonFiniteError(f"{msg}; the optimizer step was not taken (actor.skip_nonfinite: true skips it)")
        self.log(f"{msg}: step skipped (actor.skip_nonfinite)")
        self.optimizer.zero_grad(set_to_none=True)
        return False

    def _micro_batch_loss(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        algo = self.cfg.algorithm
        use_critic = algo.loss_type == "actor_critic"
        with autocast(self.cfg.actor.model.precision, self.device):  # bf16 on a GPU when asked; fp32 weights
            out = self.policy.default_forward(mb["obs"], mb["actions"], compute_values=use_critic)
        out = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in out.items()}
        pg_loss, metrics = compute_ppo_actor_loss(out["logprobs"], mb["old_logprobs"], mb["advantages"],
                                                  mb["loss_mask"], algo.clip_ratio_low, algo.clip_ratio_high,
                                                  algo.clip_ratio_c)
        entropy = masked_mean(out["entropy"], mb["loss_mask"])
        loss = pg_loss - algo.entropy_bonus * entropy
        metrics |= {"actor/policy_loss": pg_loss.detach(), "actor/entropy_loss": entropy.detach()}
        if use_critic:
            v_loss, v_metrics = compute_critic_loss(out["values"], mb["old_values"], mb["returns"], mb["loss_mask"],
                                                    algo.value_clip)
            loss = loss + algo.value_loss_coef * v_loss
            metrics |= v_metrics | {"critic/value_loss": v_loss.detach()}
        metrics["actor/total_loss"] = loss.detach()
        return loss, metrics

    # --- checkpoints -------------------------------------------------------------------------------------------------

    def save_checkpoint(self, folder: str) -> None:
        """Rank 0 writes model and optimizer into `folder` (the runner makes the folder appear atomically)."""
        if self._rank != 0:
            return
        if not all(bool(torch.isfinite(p).all()) for p in self.policy.parameters()):
            raise NonFiniteError(f"step {self.global_step}: the parameters hold NaN/inf; no checkpoint written")
        os.makedirs(folder, exist_ok=True)
        torch.save({"model": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()},
                   os.path.join(folder, "actor.pt"))
        self.policy.save_pretrained(os.path.join(folder, "model"))

    def load_checkpoint(self, folder: str) -> None:
        state = torch.load(os.path.join(folder, "actor.pt"), map_location=self.device, weights_only=True)
        self.policy.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def get_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}

    def get_rollout_batch(self) -> dict[str, torch.Tensor]:
        """This rank's trajectories (and, after stage 4, advantages): for tests and tutorials."""
        return {k: tree_map(lambda t: t.detach().cpu().clone(), v) for k, v in self.batch.items()}

    def close(self) -> None:
        if getattr(self, "sender", None) is not None:
            self.sender.close()
        self.close_collective()


def _grad_norm(model: torch.nn.Module) -> torch.Tensor:
    grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(grads).norm() if grads else torch.tensor(0.0)
