"""ReasoningRunner: the reasoning half's GRPO step on the same runtime as the embodied one; the loop around it is
runners/base.py. It carries no data beyond the prompts it puts (but under dynamic sampling): rollout, reward and
actor talk over channels.

One step (RLinf's timer names):
    prepare_data     the loader's next rollout_batch_size prompts -> dataloader channel, in chunks
    sync_weights     actor rank 0 -> every rollout rank (stages/sync.py)
    rollout || reward || actor.run_training   chunk by chunk: a chunk is scored while the next one is generated,
                     and the actor trains once it holds its share
With algorithm.max_resample > 0 (DAPO's dynamic sampling, stages/dynamic_sampling.py) the scored groups come to the
driver instead, which drops those whose rewards are all equal and refills them before the actor trains;
then, every val_check_interval steps, greedy exact match on the held-out prompts (eval/accuracy), and every
save_interval steps an atomic checkpoint (actor weights and optimizer, rng.pt, the loader's position, the step).
With runner.trace, every worker records its spans (rollout: generate per chunk, reward: score per chunk, actor:
logprobs and update; channel waits): trace.json and timeline.png of the first TRACE_FILE_STEPS steps, and
time/trace/{busy,idle}/<component> per step (scheduler/tracer.py).

RLinf counterpart: `rlinf/runners/reasoning_runner.py::ReasoningRunner` (_put_batch, _sync_weights, run,
_save_checkpoint) and `examples/reasoning/main_grpo.py`. Left out: critic, actor-inference groups, dynamic scheduler.
"""

from __future__ import annotations

from pathlib import Path

from rlinf_mini.config import TrainConfig
from rlinf_mini.data.prompt_dataset import PromptDataset, PromptLoader
from rlinf_mini.runners.base import Runner
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.worker import WorkerGroup
from stages.dynamic_sampling import dynamic_sampling, join_groups, split_groups
from stages.reasoning_reward import pass_at_k


class ReasoningRunner(Runner):
    EVAL_KEY = "eval/accuracy"

    def __init__(self, cfg: TrainConfig, actor: WorkerGroup, rollout: WorkerGroup, reward: WorkerGroup, cluster,
                 run_dir: Path, train_set: PromptDataset, val_set: PromptDataset):
        super().__init__(cfg, actor, rollout, (rollout, reward, actor), run_dir)
        self.reward = reward
        self.train_set, self.val_set = train_set, val_set
        # one message per (channel, chunk key) per step; every name carries a group name (runners side by side in
        # one cluster: the autotune's measurements)
        self.dataloader_channel = Channel.create(f"{cfg.rollout.group_name}.DataLoader", cluster, maxsize=1)
        self.rollout_channel = Channel.create(f"{cfg.rollout.group_name}.Rollout", cluster, maxsize=1)
        self.reward_channel = Channel.create(f"{cfg.reward.group_name}.Reward", cluster, maxsize=1)
        self.scored_channel = Channel.create(f"{cfg.reward.group_name}.Scored", cluster, maxsize=1)  # to the driver
        d = cfg.data
        self.loader = PromptLoader(len(train_set), d.rollout_batch_size, d.shuffle, d.seed)
        self.chunk_prompts = cfg.algorithm.rollout_batch_size_per_gpu
        self.num_chunks = d.rollout_batch_size // self.chunk_prompts

    def init_workers(self) -> None:
        rollout_init = self.rollout.init_worker()
        reward_init = self.reward.init_worker(self.rollout.world_size)
        self.weight_handles = rollout_init.wait()
        reward_init.wait()
        self.actor.init_worker().wait()
        self._trace_and_resume()

    def _put_batch(self, indices: list[int], round_: int = 0) -> int:
        """Cut prompts into chunks (the last may be short); returns how many. Chunk c's responses have global sample
        ids from first_sample_id; dynamic sampling's round k >= 1 draws its ids from a space of its own (k << 40)."""
        group = self.cfg.algorithm.group_size
        per_step = self.cfg.data.rollout_batch_size * group
        num_chunks = -(-len(indices) // self.chunk_prompts)
        for c in range(num_chunks):
            idx = indices[c * self.chunk_prompts:(c + 1) * self.chunk_prompts]
            self.dataloader_channel.put({
                "prompt_ids": [self.train_set.prompt_ids[i] for i in idx],
                "answers": [self.train_set.answers[i] for i in idx],
                "first_sample_id": (round_ << 40) + self.global_step * per_step + c * self.chunk_prompts * group,
            }, key=("prompts", c))
        return num_chunks

    def _sample_round(self, indices: list[int], round_: int) -> tuple[list[dict], list[dict], list[dict]]:
        """Generate and score responses to `indices` and bring them to the driver (dynamic sampling looks at them):
        (scored chunks, rollout metrics per rank, reward metrics per rank)."""
        k = self._put_batch(indices, round_)
        rollout_run = self.rollout.rollout(self.dataloader_channel, self.rollout_channel, k)
        reward_run = self.reward.compute_rewards(self.rollout_channel, self.scored_channel, k)
        scored = [self.scored_channel.get(key=("reward", c), expected_from=f"{self.cfg.reward.group_name} rank "
                                                                          f"{c % self.reward.world_size}")
                  for c in range(k)]
        return scored, rollout_run.wait(), reward_run.wait()

    def _dynamic_sampling_step(self) -> tuple[dict[str, float], list[list[dict]], list[dict]]:
        """Sample, drop the groups whose rewards are all equal, refill from the loader's next prompts (at most
        algorithm.max_resample rounds), and put the step's chunks for the actor."""
        G = self.cfg.algorithm.group_size
        scored, rollout_metrics, reward_metrics = self._sample_round(self.loader.next_batch(), 0)
        rounds, rewards = [rollout_metrics], list(reward_metrics)

        def sample(n: int, round_: int) -> list[dict]:
            more, rollout_m, reward_m = self._sample_round(self.loader.next_batch(n), round_)
            rounds.append(rollout_m)
            rewards.extend(reward_m)
            return [g for chunk in more for g in split_groups(chunk, G)]

        groups, metrics = dynamic_sampling([g for chunk in scored for g in split_groups(chunk, G)], sample, G,
                                           self.cfg.algorithm.max_resample)
        for c in range(self.num_chunks):
            chunk = join_groups(groups[c * self.chunk_prompts:(c + 1) * self.chunk_prompts])
            self.reward_channel.put(chunk, key=("reward", c))
        return metrics, rounds, rewards

    def evaluate(self) -> dict[str, float]:
        """Greedy responses to every held-out prompt, split over the rollout ranks; exact match by the verifier
        (eval/accuracy), and with runner.val_pass_k, eval/pass@k from sampled ones."""
        chunk = self.chunk_prompts * self.cfg.algorithm.group_size
        per_rank = self.rollout.evaluate(self.val_set.prompt_ids, self.val_set.answers, chunk).wait()
        correct = sum(flat[1::2].count(1.0) for flat in per_rank)
        out = {"eval/accuracy": correct / len(self.val_set)}
        k = self.cfg.runner.val_pass_k
        if k > 0:  # eval/pass@k: n samples per prompt, Chen et al.'s unbiased estimator, averaged over the prompts
            n = self.cfg.runner.val_num_samples if self.cfg.runner.val_num_samples != -1 else k
            per_rank = self.rollout.evaluate_samples(self.val_set.prompt_ids, self.val_set.answers, chunk, n).wait()
            counts = [int(c) for flat in per_rank for c in flat[1::2]]
            out[f"eval/pass@{k}"] = sum(pass_at_k(n, c, k) for c in counts) / len(counts)
        return out

    def train_step(self) -> dict[str, float]:
        """One GRPO step: prompts in, rollout || reward || actor chunk by chunk; global_step counts the steps done."""
        self.timings = {}
        metrics: dict[str, float] = {}
        with self.timer("step"):
            with self.timer("prepare_data"):
                if self.cfg.algorithm.max_resample == 0:  # (dynamic sampling puts each round's prompts itself)
                    self._put_batch(self.loader.next_batch())
            with self.timer("sync_weights"):
                if self.global_step % self.cfg.runner.weight_sync_interval == 0:
                    metrics |= self.update_rollout_weights()
            with self.timer("generate_and_train"):
                if self.cfg.algorithm.max_resample > 0:  # the scored groups pass through the driver, to be filtered
                    ds_metrics, rollout_rounds, reward_metrics = self._dynamic_sampling_step()
                    metrics |= ds_metrics
                    metrics |= self.actor.run_training(self.reward_channel, self.num_chunks, self.global_step,
                                                       self.reward.world_size).wait()[0]
                else:  # rollout || reward || actor, chunk by chunk
                    rollout_run = self.rollout.rollout(self.dataloader_channel, self.rollout_channel,
                                                       self.num_chunks)
                    reward_run = self.reward.compute_rewards(self.rollout_channel, self.reward_channel,
                                                             self.num_chunks)
                    actor_run = self.actor.run_training(self.reward_channel, self.num_chunks, self.global_step,
                                                        self.reward.world_size)
                    metrics |= actor_run.wait()[0]
                    rollout_rounds, reward_metrics = [rollout_run.wait()], reward_run.wait()
        n = sum(m["reward/count"] for m in reward_metrics)
        metrics["rollout/accuracy"] = sum(m["reward/correct"] for m in reward_metrics) / n
        for key in sorted({k for m in reward_metrics for k in m if k.startswith("reward_sum/")}):
            name = key.removeprefix("reward_sum/")  # each reward function's unweighted mean, and the overlong term
            metrics[f"reward/{name}"] = sum(m.get(key, 0.0) for m in reward_metrics) / n
        generate_s = sum(max(m["time/rollout/generate"] for m in ranks) for ranks in rollout_rounds)
        metrics["rollout/tokens_per_s"] = sum(m["rollout/tokens"] for ranks in rollout_rounds for m in ranks) / max(
            generate_s, 1e-9)
        metrics["time/rollout"] = generate_s
        metrics["time/reward"] = max(m["time/reward/compute"] for m in reward_metrics)
        self.global_step += 1
        return metrics | self.timings

    # --- what the loop asks of this half -------------------------------------------------------------------------

    def plot_curve(self) -> None:
        plot_reasoning_curve(self.history, self.run_dir / "learning_curve.png")

    def console_line(self, metrics: dict[str, float], step: int) -> str:
        keys = ("rollout/accuracy", "eval/accuracy", "train/actor/approx_kl", "time/step")
        return " | ".join([f"step {step}"] + [f"{k} {metrics[k]:.3g}" for k in keys if k in metrics])

    def trace_title(self) -> str:
        return "rlinf_mini reasoning: rollout || reward || actor, chunk by chunk"

    def _save_checkpoint(self, folder: Path) -> None:
        self.actor.execute_on(0).save_checkpoint(str(folder / "actor.pt")).wait()

    def _load_checkpoint(self, folder: Path, state: dict) -> None:
        self.actor.load_checkpoint(str(folder / "actor.pt")).wait()
        self.loader.load_state_dict(state["loader"])

    def _runner_state(self) -> dict:
        return {"loader": self.loader.state_dict()}


def plot_reasoning_curve(history: list[dict[str, float]], path: Path) -> Path | None:
    """learning_curve.png: held-out greedy exact match and the sampled train accuracy against the step."""
    evals = [h for h in history if "eval/accuracy" in h]
    if not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot([h["step"] for h in evals], [h["eval/accuracy"] for h in evals], marker="o", label="eval/accuracy (greedy)")
    train = [h for h in history if "rollout/accuracy" in h]
    ax.plot([h["step"] for h in train], [h["rollout/accuracy"] for h in train], alpha=0.5,
            label="rollout/accuracy (sampled)")
    ax.set(xlabel="training step", ylabel="exact match", ylim=(-0.02, 1.02), title="reasoning: held-out exact match")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
