"""Stage 5, asynchronous (async PPO): the actor keeps a store of trajectories ordered by version and trains on the
freshest with the decoupled loss, while env and rollout already produce the next batch.

    actor.construct_rollout_batch(actor_channel)  # recv one batch's pieces -> store -> drop the too stale -> batch
    actor.compute_proximal_logprobs()             # rollout.recompute_logprobs: pi_prox by a forward, [T, B]
    actor.compute_advantages_and_returns()        # stage 4, as synchronous PPO
    actor.run_training()                          # stages/train.py's update, loss_type decoupled_actor_critic

A store item is one batch's share of this rank ([T, B_rank, ...], versions [T, B_rank]), keyed by (oldest version,
mean version) as RLinf's PriorityStore; the store holds algorithm.rollout_store_size_per_rank items and the update
reads all it holds (fewer in the first steps). An item older than actor version - staleness_threshold is dropped;
one dropped before any update read it counts in rollout/discarded_unused_trajs.

RLinf counterpart: `rlinf/workers/actor/async_ppo_fsdp_worker.py::AsyncPPOEmbodiedFSDPActor`
(construct_rollout_batch, compute_proximal_logprobs), `rlinf/data/storage/replay/buffer.py::PriorityStore`. Left
out: the receiving thread (the runner's batches arrive in order), on_policy_min_ratio (refused by the config check).
This module extends stage 5 (stages/train.py), the one stage it imports.
"""

from __future__ import annotations

import bisect

import torch

from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.utils.precision import autocast
from rlinf_mini.utils.tensor_tree import tree_cat, tree_map
from stages.losses import compute_data_staleness
from stages.train import ActorWorker, flatten_batch


class RolloutStore:
    """Trajectories ordered by (oldest version, mean version, arrival); holds at most `maxsize`."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self.items: list[tuple[tuple[float, float, int], dict]] = []  # sorted ascending by key
        self.used: set[int] = set()  # arrival numbers an update has read
        self.seq = 0
        self.discarded_unused = 0

    def __len__(self) -> int:
        return len(self.items)

    def _drop(self, index: int) -> None:
        (_, _, seq), _ = self.items.pop(index)
        if seq in self.used:
            self.used.discard(seq)
        else:
            self.discarded_unused += 1

    def add(self, batch: dict) -> None:
        """Insert `batch` (its "versions" give the key); when full, the stalest item leaves."""
        versions = batch["versions"].double()
        key = (versions.min().item(), versions.mean().item(), self.seq)
        self.seq += 1
        bisect.insort(self.items, (key, batch), key=lambda item: item[0])
        if len(self.items) > self.maxsize:
            self._drop(0)

    def remove_below(self, min_version: float) -> None:
        """Drop every item whose oldest sample is older than min_version."""
        while self.items and self.items[0][0][0] < min_version:
            self._drop(0)

    def topn(self, n: int) -> list[dict]:
        """The n freshest items, freshest first; they count as used."""
        chosen = self.items[::-1][:n]
        self.used.update(key[2] for key, _ in chosen)
        return [batch for _, batch in chosen]


class AsyncActorWorker(ActorWorker):
    def init_worker(self, world_sizes: dict[str, int]) -> None:
        super().init_worker(world_sizes)
        self.rollout_store = RolloutStore(self.cfg.algorithm.rollout_store_size_per_rank)

    def construct_rollout_batch(self, actor_channel: Channel) -> dict[str, float]:
        """Take the next batch's pieces into the store, drop what is staler than the bound, and make the training
        batch of what the store holds; returns RLinf's rollout/data_staleness_<k>/ratio, discarded_unused_trajs."""
        self.recv_rollout_trajectories(actor_channel)  # self.batch: [T, B_rank, ...]
        self.rollout_store.add(self.batch)
        self.rollout_store.remove_below(self.global_step - self.cfg.algorithm.staleness_threshold)
        items = self.rollout_store.topn(self.rollout_store.maxsize)
        # a new dict: stage 4 writes advantages into self.batch, not into the stored items
        self.batch = {name: tree_cat([b[name] for b in items], dim=1) for name in items[0]}  # [T, B_rank * n, ...]
        oldest = int(self.batch["versions"].min())
        if oldest < self.global_step - self.cfg.algorithm.staleness_threshold:  # the runner's bound, checked here
            raise RuntimeError(f"actor version {self.global_step} got a sample of version {oldest}: staler than "
                               f"algorithm.staleness_threshold={self.cfg.algorithm.staleness_threshold}")
        staleness = compute_data_staleness(self.batch["versions"], self.global_step)
        return {f"rollout/{k}": v for k, v in staleness.items()} | {
            "rollout/discarded_unused_trajs": float(self.rollout_store.discarded_unused),
            "rollout/store_size": float(len(items))}

    def compute_proximal_logprobs(self) -> None:
        """rollout.recompute_logprobs: the proximal policy's log-probs [T, B(, ...)] of the batch's actions, by a
        forward with the actor's weights before this update (micro-batches, no gradient). With a critic the same
        forward gives the proximal values (RLinf's `proximal_values`, which its compute_advantages_and_returns and
        critic loss take over the behaviour's `prev_values`): values[:T] become the current critic's, so GAE and
        the value clip's anchor are those of the weights being trained, as in a synchronous step; values[T] (the
        last obs', not in the batch) stays the rollout's."""
        T, B = self.batch["rewards"].shape
        flat = flatten_batch(self.batch | {"advantages": self.batch["rewards"], "returns": self.batch["rewards"],
                                           "loss_mask": self.batch["rewards"]})  # only obs and actions are read
        size, critic = self.cfg.actor.micro_batch_size, self.cfg.actor.model.add_value_head
        logprobs, values = [], []
        self.policy.eval()
        with torch.no_grad():
            for start in range(0, T * B, size):
                idx = slice(start, start + size)
                obs = tree_map(lambda t, i=idx: t[i], flat["obs"])
                with autocast(self.cfg.actor.model.precision, self.device):
                    out = self.policy.default_forward(obs, flat["actions"][idx], compute_values=critic)
                logprobs.append(out["logprobs"])
                if critic:
                    values.append(out["values"])
        self.batch["proximal_logprobs"] = torch.cat(logprobs).float().view_as(self.batch["logprobs"])
        if critic:  # [T + 1, B]: a new tensor, the store's item keeps the behaviour values
            self.batch["values"] = torch.cat([torch.cat(values).float().view(T, B), self.batch["values"][T:]])
