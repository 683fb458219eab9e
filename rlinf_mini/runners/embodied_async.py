"""AsyncEmbodiedRunner: asynchronous PPO (algorithm.loss_type: decoupled_actor_critic). Env and rollout produce the
next batches while the actor trains on the current one; the loop around a step is runners/base.py's.

A batch (one `env.interact` || `rollout.generate`, every env's rollout epochs) is the unit of version. Batch i may
start once i <= actor version + algorithm.staleness_threshold (AReaL's rule), and it starts by loading the newest
weights actor rank 0 has published (>= i - staleness_threshold: the rollout waits for that stamp). The driver queues
the calls one version before the bound lets them start and does not wait for them: each worker runs its calls in
order, so (threshold 1) env and rollout run batch i+1 while the actor trains batch i, and start batch i+2 when
version i+1 is stamped. One step:

    launch batches            rollout.load_newest_weights(i - s); env.interact(i) || rollout.generate()   (queued)
    construct_rollout_batch   actor: batch `step`'s pieces -> its store (stages/train_async.py)
    [compute_proximal_logprobs]   rollout.recompute_logprobs: true
    cal_adv_and_returns, actor_training   as the sync runner (the decoupled loss)
    sync_weights              actor rank 0 publishes version step + 1 (waited for unless actor.sync_weight_no_wait)

A checkpoint is a barrier: no batch is launched across a save step, so the env state saved is the step's and a run
resumes as it would have gone on. With staleness_threshold 0 the schedule is the synchronous one.

RLinf counterpart: `rlinf/runners/async_ppo_embodied_runner.py::AsyncPPOEmbodiedRunner` (long-lived env / rollout
services there; batches queued on in-order workers here). Left out: its metric channels (the calls return metrics).
"""

from __future__ import annotations

import collections

from rlinf_mini.runners.embodied import EmbodiedRunner, generation_metrics
from rlinf_mini.scheduler.worker import GroupFuture


class AsyncEmbodiedRunner(EmbodiedRunner):
    TRACE_WINDOW = "construct_rollout_batch"  # the trace's overlap metrics: the actor's wait for its batch

    def batches_in_flight(self) -> int:
        return self.cfg.algorithm.staleness_threshold + 1

    def init_workers(self) -> None:
        super().init_workers()  # resumes, when asked: global_step is the step to run next
        self.staleness_threshold = self.cfg.algorithm.staleness_threshold
        self.in_flight: collections.deque = collections.deque()  # (batch, load, env_run, rollout_run) futures
        self.next_batch = self.global_step  # the next batch to launch
        self.published = -1  # the newest version actor rank 0 has been asked to publish
        self.pending_publish: GroupFuture | None = None  # actor.sync_weight_no_wait: collected one step later
        self.launch_log: list[tuple[int, int]] = []  # (batch, actor version when it was queued): for tests
        self.pending_drains: list[GroupFuture] = []  # env / rollout trace drains queued behind batches

    # --- weights ------------------------------------------------------------------------------------------------------

    def publish_weights(self) -> dict[str, float]:
        """Actor rank 0 writes version global_step into every rollout buffer (a rollout rank reads it when its next
        batch starts); the previous no-wait publish is collected first."""
        metrics = self._collect_publish()
        if self.published == self.global_step:
            return metrics
        self.pending_publish = self.actor.sync_model_to_rollout(self.weight_handles, self.global_step)
        self.published = self.global_step
        return metrics if self.cfg.actor.sync_weight_no_wait else self._collect_publish()

    def _collect_publish(self) -> dict[str, float]:
        if self.pending_publish is None:
            return {}
        sent, self.pending_publish = self.pending_publish.wait()[0], None
        return sent

    def update_rollout_weights(self) -> dict[str, float]:
        """Before an eval: publish, and the rollout loads the newest version after the batches it has queued."""
        metrics = self.publish_weights() | self._collect_publish()
        self.rollout_version = min(self.rollout.load_newest_weights(self.global_step).wait())
        return metrics

    # --- the schedule -------------------------------------------------------------------------------------------------

    def _saves_at(self, step: int) -> bool:
        interval = self.cfg.runner.save_interval
        return interval > 0 and (step % interval == 0 or step == self.max_steps)

    def may_launch(self, batch: int) -> bool:
        """Queue batch b once b <= actor version + staleness_threshold + 1, within the run, not across a checkpoint.
        AReaL's bound (b <= version + threshold) is the rollout's to keep: b's first call waits for version b -
        threshold. Queued one version early, the batch starts the moment actor rank 0 stamps that version, instead
        of after the driver has seen the publish return and queued it (RLinf's rollout blocks in wait_if_stale)."""
        return (batch < self.max_steps and batch <= self.global_step + self.staleness_threshold + 1
                and not any(self._saves_at(g) for g in range(self.global_step + 1, batch + 1)))

    def launch_rollouts(self) -> None:
        """Queue every batch may_launch allows; the calls return at once, the workers run them in order."""
        while self.may_launch(self.next_batch):
            b = self.next_batch
            load = self.rollout.load_newest_weights(max(b - self.staleness_threshold, 0))
            env_run = self.env.interact(self.rollout_channel, self.env_channel, self.actor_channel, b)
            rollout_run = self.rollout.generate(self.rollout_channel, self.env_channel)
            self.in_flight.append((b, load, env_run, rollout_run))
            self.launch_log.append((b, self.global_step))
            self.next_batch += 1

    def _collect_batch(self) -> dict[str, float]:
        """The env and rollout metrics of batch global_step (done: the actor holds its trajectories)."""
        b, load, env_run, rollout_run = self.in_flight.popleft()
        assert b == self.global_step, (b, self.global_step)  # batches are trained in launch order
        versions = load.wait()
        return generation_metrics(env_run.wait(), rollout_run.wait()) | {"rollout/weight_version": min(versions)}

    def train_step(self) -> dict[str, float]:
        """One training step of the asynchronous schedule (see the module docstring); global_step counts the steps
        done, which is the actor's weight version."""
        self.timings = {}
        metrics: dict[str, float] = {}
        with self.timer("step"):
            self.actor.set_global_step(self.global_step).wait()
            with self.timer("sync_weights"):
                metrics |= self.publish_weights()  # version global_step: the run's first, or a resumed one's
            self.launch_rollouts()
            with self.timer("construct_rollout_batch"):
                metrics |= self.actor.construct_rollout_batch(self.actor_channel).wait()[0]
                metrics |= self._collect_batch()
            if self.cfg.rollout.recompute_logprobs:
                with self.timer("compute_proximal_logprobs"):
                    self.actor.compute_proximal_logprobs().wait()
            with self.timer("cal_adv_and_returns"):
                metrics |= self.actor.compute_advantages_and_returns().wait()[0]
            with self.timer("actor_training"):
                metrics |= self.actor.run_training().wait()[0]
            self.global_step += 1
            with self.timer("update_rollout_weights"):
                metrics |= self.publish_weights()  # the next batch to start reads it
        return metrics | self.timings

    def drain_worker_spans(self) -> list:
        """The env's and rollout's drains queue behind their batches in flight: waiting for them would hold the
        driver until the next batch's rollout ends, and the update could not overlap it. So they are queued each
        step and read once done (a later step's gather; the run's last step, with no batch in flight, waits for
        them): a step's trace metrics may miss env / rollout spans that are still in flight."""
        self.pending_drains += [self.env.trace_drain(), self.rollout.trace_drain()]
        ready = [f for f in self.pending_drains if f.done() or not self.in_flight]
        self.pending_drains = [f for f in self.pending_drains if f not in ready]
        return [s for f in [self.actor.trace_drain(), *ready] for per_rank in f.wait() for s in per_rank]

    def trace_title(self) -> str:
        return f"rlinf_mini async PPO, staleness_threshold={self.staleness_threshold}"
