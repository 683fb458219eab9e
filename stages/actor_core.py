"""The actor core both halves share (stage 5 and its reasoning twin): one update loop over a loss callback, and the
parts of an actor worker that do not depend on what it trains.

    update_loop(model, optimizer, n, loss_fn, ...)   # epochs -> global batches -> micro-batches -> optimizer steps
    loss_fn(model, idx) -> (loss, metrics)            # idx [n_mb]: the micro-batch's sample indices

One optimizer step per global_batch_size / W samples per rank: micro-batch losses divided by the accumulation count
before backward (their gradients add up to the mean's), then with W > 1 ranks one all-reduce of the flat gradient
(DDP without its wrapper), the gradient norm (clipped to actor.optim.clip_grad when > 0, logged either way), the
non-finite check every rank agrees on, the optimizer step and the lr schedule. The shuffle depends on (seed, step,
epoch, rank) only, so a resumed run shuffles the same way.

RLinf counterpart: `rlinf/workers/actor/fsdp_actor_worker.py` (`FSDPActor.run_training`, `EmbodiedFSDPActor.
run_training`: the same loop in each), `rlinf/hybrid_engines/fsdp/utils.py::get_lr_scheduler`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from rlinf_mini.scheduler import faults
from rlinf_mini.scheduler.tracer import span
from rlinf_mini.scheduler.worker import Worker
from stages.sync import WeightBufferHandle

LossFn = Callable[[torch.nn.Module, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class NonFiniteError(FloatingPointError):
    """A NaN or inf in the loss or the gradients: the step is not taken (and no checkpoint holds it)."""


def raise_if_not_finite(loss_finite: bool, grad_norm: float, where: str) -> bool:
    """The one-process check: raise NonFiniteError, else True (the step is taken)."""
    if not (loss_finite and math.isfinite(grad_norm)):
        raise NonFiniteError(f"non-finite loss or gradient norm ({where})")
    return True


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim) -> torch.optim.lr_scheduler.LambdaLR:
    """actor.optim's schedule as RLinf's FSDP actor builds it (`get_lr_scheduler`): linear warmup from 0 over
    lr_warmup_steps (-1: lr_warmup_steps_ratio x total_training_steps), then 'constant', or 'cosine' down to the
    floor over total_training_steps (transformers' schedule). Stepped after every optimizer step; its state goes in
    the checkpoint."""
    from torch.optim.lr_scheduler import LambdaLR

    total = optim.total_training_steps
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps >= 0 else int(optim.lr_warmup_steps_ratio * total)
    if optim.lr_scheduler == "cosine":
        from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

        # the floor as a share of lr: transformers divides min_lr by optimizer.defaults["lr"], which is AdamW's own
        # 1e-3 when every param group brings its lr (the embodied actor's lr / value_lr groups)
        rate = optim.min_lr_rate if optim.min_lr_rate is not None else optim.min_lr / optim.lr
        return get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, total, optim.num_cycles,
                                                           min_lr_rate=rate)
    return LambdaLR(optimizer, lambda step: step / max(1.0, warmup) if step < warmup else 1.0)


def grad_norm_of(model: torch.nn.Module) -> torch.Tensor:
    """The global L2 norm of the gradients (what clip_grad_norm_ returns), without clipping."""
    grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(grads).norm() if grads else torch.tensor(0.0)


def update_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, n: int, loss_fn: LossFn, actor, *,
                update_epoch: int, global_step: int = 0, rank: int = 0, world_size: int = 1,
                average_gradients: Callable[[], None] = lambda: None,
                step_is_finite: Callable[[bool, float, str], bool] = raise_if_not_finite,
                lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                ) -> tuple[dict[str, float], int]:
    """`update_epoch` passes over this rank's n samples; `actor` is cfg.actor (batch sizes, seed, optim.clip_grad).

    Returns (this rank's mean of every metric over the steps taken, the number of steps skipped); a micro-batch's
    metrics count once, the step's grad_norm and lr once per micro-batch of it."""
    per_rank_batch = actor.global_batch_size // world_size
    accum = per_rank_batch // actor.micro_batch_size
    totals: dict[str, float] = {}
    count, skipped = 0, 0
    model.train()
    for epoch in range(update_epoch):
        seed = ((actor.seed * 1_000_003 + global_step) * 1009 + epoch) * 101 + rank
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        for start in range(0, n, per_rank_batch):
            batch_idx = perm[start : start + per_rank_batch]
            optimizer.zero_grad(set_to_none=True)
            step_metrics: list[tuple[str, float]] = []  # this optimizer step's; dropped if it is skipped
            loss_finite = True
            for m in range(accum):
                idx = batch_idx[m * actor.micro_batch_size : (m + 1) * actor.micro_batch_size]
                with span("forward_backward"):
                    loss, metrics = loss_fn(model, idx)
                    loss = faults.poison(loss)  # NaN only while an injected kind=nan fault fires
                    loss_finite = loss_finite and bool(torch.isfinite(loss))
                    (loss / accum).backward()
                step_metrics += [(k, float(v)) for k, v in metrics.items()]
            average_gradients()
            clip = actor.optim.clip_grad
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip) if clip > 0 else grad_norm_of(model)
            if not step_is_finite(loss_finite, float(grad_norm), f"update epoch {epoch}, sample {start}"):
                skipped += 1
                continue
            step_metrics.append(("actor/grad_norm", float(grad_norm) * accum))
            step_metrics.append(("actor/lr", optimizer.param_groups[0]["lr"] * accum))  # the lr of this step
            for k, v in step_metrics:
                totals[k] = totals.get(k, 0.0) + v
            count += accum
            with span("optimizer_step"):
                optimizer.step()
                if lr_scheduler is not None:
                    lr_scheduler.step()
    return {k: v / max(count, 1) for k, v in totals.items()}, skipped


class ActorCore(Worker):
    """What an actor worker does whatever it trains: `self.model` (the trained module), `self.optimizer`,
    `self.sender` (rank 0's WeightSender, else None) and `self.global_step` are set by the subclass's init_worker."""

    def sync_model_to_rollout(self, handles: list[WeightBufferHandle], version: int) -> dict[str, float]:
        """Rank 0 writes its weights into every rollout rank's buffer (the others hold the same weights)."""
        if self.sender is None:
            return {}
        start = time.monotonic()
        nbytes = self.sender.send(self.model, handles, version)
        seconds = time.monotonic() - start
        return {"sync/bytes": float(nbytes), "sync/seconds": seconds, "sync/GBps": nbytes / max(seconds, 1e-9) / 1e9}

    def _average_gradients(self) -> None:
        """Mean of the ranks' gradients, in place: one all-reduce of all gradients flattened into one vector.
        Parameters without a gradient (the value head with loss_type 'actor') have none on every rank."""
        if self._world_size == 1:
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
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

    def get_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def close(self) -> None:
        if getattr(self, "sender", None) is not None:
            self.sender.close()
        self.close_collective()
