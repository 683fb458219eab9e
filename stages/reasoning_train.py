"""Stage 4'+5' (reasoning) — the actor: GRPO advantages per group over response tokens, then a token-level clipped
update; data-parallel over the actor ranks.

    actor.run_training(reward_channel, num_chunks)   # its share of the chunks -> advantages -> update -> metrics

Actor rank a takes a contiguous block of the chunks, in chunk order (whatever order they arrive in), and stacks
them: prompt_ids [N, P] left-padded, response_ids / response_mask / logprobs [N, R] right-padded, rewards [N].
    advantages [N, R] = (r - mean_G(r)) / (std_G(r) + 1e-6) on every response token      (std unbiased, as RLinf)
    old_logprobs      = the actor's own recomputation if algorithm.recompute_logprobs, else the rollout's
    loss = loss_agg_func(clipped PPO token loss) + kl_beta * loss_agg_func(kl(logprobs, ref_logprobs)), over the
           loss mask: the response tokens, less a truncated response's with algorithm.mask_truncated_completions
Log-probs come from one forward over prompt + response (attention_mask and position ids as in the rollout) with
logits only for the response positions: log_softmax(logits / temperature) at the response tokens.

RLinf counterpart: `rlinf/workers/actor/fsdp_actor_worker.py::FSDPActor` (run_training, compute_logprobs,
sync_model_to_rollout), `rlinf/algorithms/advantages.py::compute_grpo_advantages`, `rlinf/algorithms/losses.py::
compute_ppo_actor_loss` (loss_agg_func), `rlinf/algorithms/utils.py::kl_penalty`. Left out: FSDP/Megatron,
dynamic batch sizes, entropy bonus, critic (PPO for reasoning).
"""

from __future__ import annotations

import copy
import time

import torch

from rlinf_mini.models.generation import position_ids_of
from rlinf_mini.models.tiny_lm import load_causal_lm
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.tracer import span
from rlinf_mini.utils.precision import autocast
from stages.actor_core import ActorCore, build_lr_scheduler, update_loop
from stages.losses import compute_ppo_actor_loss, kl_penalty
from stages.sync import WeightSender


def compute_grpo_token_advantages(rewards: torch.Tensor, response_mask: torch.Tensor, group_size: int,
                                  scale_rewards: str = "group") -> torch.Tensor:
    """rewards [N] (N = groups x G, a group's responses consecutive), response_mask [N, R] -> advantages [N, R]:
    r - its group's mean, divided by the group's std, the batch's std, or nothing (algorithm.scale_rewards)."""
    grouped = rewards.view(-1, group_size)  # [N/G, G]
    centred = grouped - grouped.mean(dim=-1, keepdim=True)
    if scale_rewards == "group":
        centred = centred / (grouped.std(dim=-1, keepdim=True) + 1e-6)
    elif scale_rewards == "batch":
        centred = centred / (rewards.std() + 1e-6)
    return centred.reshape(-1, 1) * response_mask  # [N, R]


def sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor
                       ) -> torch.Tensor:
    """GSPO's per-response log importance ratio, mean over its tokens of log(pi / pi_old) [n], on every token [n, R]
    (zero where masked)."""
    mask = response_mask.float()
    per_response = ((logprobs - old_logprobs) * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # [n]
    return per_response.unsqueeze(-1) * mask  # [n, R]


def truncated_responses(response_ids: torch.Tensor, response_mask: torch.Tensor, eos_id: int) -> torch.Tensor:
    """[N] bool: the response stopped without <eos> (generation ends at <eos> or at max_new_tokens, so a last
    token that is not <eos> means it was cut at the length limit)."""
    last = (response_mask.sum(dim=-1) - 1).clamp(min=0).long()  # [N] index of each response's last token
    return response_ids.gather(-1, last[:, None]).squeeze(-1) != eos_id


def loss_mask_of(response_ids: torch.Tensor, response_mask: torch.Tensor, eos_id: int,
                 mask_truncated_completions: bool) -> torch.Tensor:
    """The tokens that count in the loss [N, R]: the response's, less a truncated response's when
    algorithm.mask_truncated_completions (TRL's)."""
    mask = response_mask.float()
    if mask_truncated_completions:
        mask = mask * (~truncated_responses(response_ids, response_mask, eos_id)).float()[:, None]
    return mask


def token_weights(response_mask: torch.Tensor, loss_agg_func: str) -> torch.Tensor:
    """[N, R] weights w such that sum(loss * w) / sum(w) is the loss_agg_func of a token loss [N, R]."""
    mask = response_mask.float()
    if loss_agg_func == "seq-mean-token-mean":  # each response weighs 1, spread over its tokens
        return mask / mask.sum(dim=-1, keepdim=True).clamp(min=1)
    return mask  # token-mean; seq-mean-token-sum rescales this afterwards (agg_scale)


def agg_scale(response_mask: torch.Tensor, loss_agg_func: str) -> float:
    """The factor that turns the token_weights-weighted mean into loss_agg_func: 1 for token-mean; for the seq-mean
    forms sum(w) / responses, so that every response of the batch counts in the mean over responses, one with no
    token in the loss (mask_truncated_completions) as a zero, as RLinf's seq_mean_token_sum and TRL do."""
    if loss_agg_func == "token-mean":
        return 1.0
    return float(token_weights(response_mask, loss_agg_func).sum()) / response_mask.shape[0]


def compute_response_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                              response_ids: torch.Tensor, response_mask: torch.Tensor,
                              temperature: float) -> torch.Tensor:
    """log pi(response token | prefix) [N, R], from one forward over [prompt | response] [N, P + R]."""
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # [N, P+R]
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)  # [N, P+R]
    R = response_ids.shape[1]
    # logits at positions P-1 .. P+R-2 predict response tokens 0 .. R-1: keep the last R+1, drop the final one
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_of(attention_mask),
                   logits_to_keep=R + 1).logits[:, :-1]  # [N, R, V]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1) * response_mask  # [N, R]


def grpo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                     response_mask: torch.Tensor, algo) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped policy loss of responses [n, R], aggregated by algo.loss_agg_func; the ratio per token, or with
    algo.importance_sampling_level 'sequence' (GSPO) one per response on each of its tokens."""
    w, scale = token_weights(response_mask, algo.loss_agg_func), agg_scale(response_mask, algo.loss_agg_func)
    ratio_logprobs = logprobs  # what the ratio is taken of
    if algo.importance_sampling_level == "sequence":
        ratio_logprobs = old_logprobs + sequence_log_ratio(logprobs, old_logprobs, response_mask)
    # token level: every response token is one sample [n * R]; compute_ppo_actor_loss averages with its mask,
    # so weights w (and a scale) turn that mean into loss_agg_func; its ratio / clip metrics are w-weighted too
    pg_loss, metrics = compute_ppo_actor_loss(
        ratio_logprobs.reshape(-1), old_logprobs.reshape(-1), advantages.reshape(-1), w.reshape(-1),
        algo.clip_ratio_low, algo.clip_ratio_high, algo.clip_ratio_c)
    loss = pg_loss * scale
    metrics["actor/policy_loss"] = loss.detach()
    return loss, metrics


def stack_chunks(chunks: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Chunks of different widths -> one batch: prompts left-padded to the widest P, responses right-padded to R."""
    P = max(c["prompt_ids"].shape[1] for c in chunks)
    R = max(c["response_ids"].shape[1] for c in chunks)

    def pad(t: torch.Tensor, width: int, left: bool, value: float) -> torch.Tensor:
        extra = width - t.shape[1]
        return torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

    return {
        "prompt_ids": torch.cat([pad(c["prompt_ids"], P, True, pad_id) for c in chunks]),
        "prompt_mask": torch.cat([pad(c["prompt_mask"], P, True, 0) for c in chunks]),
        "response_ids": torch.cat([pad(c["response_ids"], R, False, pad_id) for c in chunks]),
        "response_mask": torch.cat([pad(c["response_mask"], R, False, 0) for c in chunks]),
        "logprobs": torch.cat([pad(c["logprobs"], R, False, 0.0) for c in chunks]),
        "rewards": torch.cat([c["rewards"] for c in chunks]),
        "versions": torch.tensor([float(c["version"]) for c in chunks for _ in range(len(c["rewards"]))]),
    }


class ReasoningActorWorker(ActorCore):
    def init_worker(self) -> None:
        """The model from actor.model.model_path (identical on every rank), AdamW, and a frozen reference copy when
        kl_beta > 0."""
        if self._world_size > 1:
            self.init_collective(self.cfg.cluster.timeout_s)
        self.model, self.tokenizer = load_causal_lm(self.cfg.actor.model.model_path)
        self.model.to(self.device)
        self.ref_model = (copy.deepcopy(self.model).eval().requires_grad_(False)
                          if self.cfg.algorithm.kl_beta > 0 else None)  # frozen: never a grad, never a step
        o = self.cfg.actor.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=(o.adam_beta1, o.adam_beta2),
                                           eps=o.adam_eps, weight_decay=o.weight_decay)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, o)
        self.sender = WeightSender() if self._rank == 0 else None
        self.global_step = 0

    def _logprobs(self, model, b: dict, idx: torch.Tensor) -> torch.Tensor:
        with autocast(self.cfg.actor.model.precision, self.device):  # bf16 on a GPU when asked (fp32 masters)
            return compute_response_logprobs(model, b["prompt_ids"][idx], b["prompt_mask"][idx],
                                             b["response_ids"][idx], b["response_mask"][idx],
                                             self.cfg.algorithm.sampling_params.temperature)

    def run_training(self, input_channel: Channel, num_chunks: int, global_step: int,
                     reward_world_size: int) -> dict[str, float]:
        """Receive this rank's chunks, compute advantages, and take global_batch_size-sized optimizer steps."""
        cfg, algo = self.cfg.actor, self.cfg.algorithm
        self.global_step = global_step
        per_rank = num_chunks // self._world_size
        mine = range(self._rank * per_rank, (self._rank + 1) * per_rank)
        chunks = [input_channel.get(key=("reward", c), expected_from=f"{self.cfg.reward.group_name} rank "
                                                                      f"{c % reward_world_size}") for c in mine]
        start = time.monotonic()
        b = {k: v.to(self.device) for k, v in stack_chunks(chunks, self.tokenizer.pad_token_id).items()}
        if self.cfg.reward.permute_rewards:  # the control: rewards detached from the responses they scored
            perm = torch.randperm(len(b["rewards"]), generator=torch.Generator().manual_seed(cfg.seed + global_step))
            b["rewards"] = b["rewards"][perm.to(self.device)]
        mask = b["response_mask"].float()  # [N, R]
        # advantages from every response's reward (a truncated one's too, as TRL); the loss mask may then drop some
        b["loss_mask"] = loss_mask_of(b["response_ids"], b["response_mask"], self.tokenizer.eos_token_id,
                                      algo.mask_truncated_completions)  # [N, R]
        truncated = truncated_responses(b["response_ids"], b["response_mask"], self.tokenizer.eos_token_id)  # [N]
        b["advantages"] = compute_grpo_token_advantages(b["rewards"], mask, algo.group_size, algo.scale_rewards)
        n = len(b["rewards"])
        everything = torch.arange(n)
        self.model.eval()
        with torch.no_grad(), span("logprobs"):  # old (and reference) log-probs, in micro-batches
            mbs = cfg.micro_batch_size
            if algo.recompute_logprobs:
                b["logprobs"] = torch.cat([self._logprobs(self.model, b, everything[i:i + mbs])
                                           for i in range(0, n, mbs)])
            if self.ref_model is not None:
                b["ref_logprobs"] = torch.cat([self._logprobs(self.ref_model, b, everything[i:i + mbs])
                                               for i in range(0, n, mbs)])
        means, skipped = update_loop(self.model, self.optimizer, n, lambda model, idx: self._micro_batch_loss(b, idx),
                                     cfg, update_epoch=algo.update_epoch, global_step=global_step, rank=self._rank,
                                     world_size=self._world_size, average_gradients=self._average_gradients,
                                     step_is_finite=self._step_is_finite, lr_scheduler=self.lr_scheduler)
        self.model.eval()
        sums = self.all_reduce(torch.tensor([float(b["rewards"].sum()), float(n), float(mask.sum()),
                                             float(truncated.sum())], device=self.device))
        out = {f"train/{k}": v for k, v in sorted(means.items())}
        result = self.all_reduce(torch.tensor(list(out.values()), device=self.device)) / self._world_size
        out = dict(zip(out, result.tolist(), strict=True))
        if cfg.skip_nonfinite:
            out["train/skipped_steps"] = float(skipped)
        out |= {"rollout/rewards": float(sums[0] / sums[1]), "rollout/response_length": float(sums[2] / sums[1]),
                "rollout/staleness": float(global_step - b["versions"].mean()),
                "rollout/truncated_fraction": float(sums[3] / sums[1]),
                "time/actor/train": time.monotonic() - start}
        return out

    def _micro_batch_loss(self, b: dict, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        algo = self.cfg.algorithm
        mask = b["loss_mask"][idx]  # [n, R]: the response tokens that count (the forward attends to all of them)
        logprobs = self._logprobs(self.model, b, idx)  # [n, R]
        loss, metrics = grpo_policy_loss(logprobs, b["logprobs"][idx], b["advantages"][idx], mask, algo)
        w, scale = token_weights(mask, algo.loss_agg_func), agg_scale(mask, algo.loss_agg_func)
        if self.ref_model is not None:
            kl = kl_penalty(logprobs, b["ref_logprobs"][idx], algo.kl_penalty_type)  # [n, R]
            kl_loss = (kl * w).sum() / w.sum().clamp(min=1e-8) * scale
            loss = loss + algo.kl_beta * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()  # RLinf's name (train/actor/kl_loss in metrics.jsonl)
        return loss, metrics

    def save_checkpoint(self, path: str) -> None:
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "lr_scheduler": self.lr_scheduler.state_dict()}, path)

    def load_checkpoint(self, path: str) -> None:
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
