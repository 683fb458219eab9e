"""Stage 3 — rollout: env workers and rollout workers exchange observations and actions over two queues, pipelined.

    runner:   env.interact(rollout_channel, env_channel, actor_channel, step)   } started together; the runner
              rollout.generate(rollout_channel, env_channel)                    } waits for both
    env:      for each chunk step t, for each stage k:  get actions(k) -> env k steps -> put obs(k)
    rollout:  for each chunk step t, for each stage k:  get obs(k) -> policy infers -> put actions(k)

Each env rank splits its envs into `rollout.pipeline_stage_num` stages (S), each a separate vector env. The env sends
the observations of all stages first; from then on, while it steps stage k, the rollout is already inferring the
actions of stage k+1, whose observations arrived earlier. With S = 1 the two wait for each other; with S = 2 and
equal env and inference times, each hides the other (RLinf's "fine-grained pipelining").

Queues (`Channel` keys):  Rollout channel ("train"|"eval", env rank, stage) carries {obs, env_ids [B], sample_step}
(obs: [B, D] states, or a dict with images [B, 3, H, W] and task_descriptions strings); Env channel, same keys, carries
{actions [B, C, A] or [B, C], logprobs [B], values [B], version} and, for models that tokenize (the VLA), the
forward_inputs (images, token ids, action tokens), which the env stores in the trajectory in place of the raw obs.
When episodes ended by truncation in the chunk, the obs message also carries their final_obs (algorithm.bootstrap_type)
and the reply its bootstrap_values [B]: those episodes' last rewards gain gamma * V(final obs).
After T = max_steps_per_rollout_epoch / C chunk steps the rollout infers the values once more (the value head alone),
so a trajectory holds values [T+1, B]. At the end of the rollout epoch(s) the env cuts its trajectories into pieces,
one per actor share, and puts them on the Actor channel.

Randomness: the action noise of env `e` at sample step `s` is `counter_uniform(seed, e, s)`, a function of the env id
and the step only, so pipelined and unpipelined rollouts (or 1 and 2 env ranks) produce identical trajectories.

RLinf counterpart: `rlinf/workers/env/env_worker.py::EnvWorker` (`interact`, `evaluate`, `_run_interact_once`) and
`rlinf/workers/rollout/hf/huggingface_worker.py::MultiStepRolloutWorker` (`generate`, `sync_model_from_actor`).
Left out: reward models, offloading, `send_to`/`recv_from` routing (keys do that job here).
Next stage: `stages/advantages.py`.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import time

import torch

from rlinf_mini.config import EnvSplitConfig, TrainConfig
from rlinf_mini.envs import EnvSpec, get_env_spec, make_env
from rlinf_mini.envs.base import per_task_eval_sums
from rlinf_mini.envs.guard import GuardedEnv
from rlinf_mini.envs.video import EvalVideoRecorder
from rlinf_mini.models import build_policy
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.tracer import span
from rlinf_mini.scheduler.worker import Worker
from rlinf_mini.utils.precision import autocast
from rlinf_mini.utils.running_stats import ReturnScaler
from rlinf_mini.utils.seeding import counter_uniform
from rlinf_mini.utils.tensor_tree import tree_cat_split, tree_map, tree_stack
from stages.placement import actor_pieces, env_ranks_of_rollout
from stages.sync import WeightBufferHandle, make_weight_receiver

TRAJECTORY_KEYS = ("obs", "actions", "logprobs", "values", "rewards", "dones", "versions")


def _stack_trajectory(tr: dict[str, list]) -> dict[str, torch.Tensor]:
    """One stage's per-step records -> [T(+1), B, ...] tensors; rewards and dones reduced over the chunk here."""
    out = {name: tree_stack(tr[name]) for name in ("obs", "actions", "logprobs", "values")}
    out["rewards"] = torch.stack(tr["rewards"]).sum(dim=2)  # [T, B, C] -> [T, B]: one reward per chunk step
    terminations, truncations = (torch.stack(x) for x in zip(*tr["dones"], strict=True))
    out["dones"] = (terminations | truncations).any(dim=2)  # [T, B]
    versions = torch.tensor(tr["versions"], dtype=torch.int64)  # [T]
    out["versions"] = versions.view(-1, *[1] * (out["logprobs"].dim() - 1)).expand_as(out["logprobs"]).clone()
    return {name: out[name] for name in TRAJECTORY_KEYS}


def final_obs_of(cfg: TrainConfig) -> str:
    """algorithm.bootstrap_type: which ended episodes gain gamma * V(final obs) on their last reward ('truncations',
    'dones'); 'none' with no value head, no GAE or no auto-reset (nothing to bootstrap)."""
    algo = cfg.algorithm
    if not (cfg.env.train.auto_reset and algo.adv_type == "gae" and cfg.actor.model.add_value_head):
        return "none"
    return {"standard": "truncations", "always": "dones"}[algo.bootstrap_type]


class EnvWorker(Worker):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.stage_num = cfg.rollout.pipeline_stage_num
        self.chunks = cfg.actor.model.num_action_chunks

    def _make_stage_envs(self, split: EnvSplitConfig, key: str) -> list:
        n = split.total_num_envs // self._world_size // self.stage_num  # sub-envs per stage
        envs = []
        for k in range(self.stage_num):
            first = (self._rank * self.stage_num + k) * n  # global ids are contiguous: rank-major, then stage
            env = make_env(split, torch.arange(first, first + n), self.chunks, key=key)
            envs.append(GuardedEnv(env, f"{self._group_name} rank {self._rank} {key} pipeline stage {k}"))
        return envs

    def init_worker(self, world_sizes: dict[str, int]) -> EnvSpec:
        """Build the stage envs (train and eval) and reset the train envs. world_sizes: {"env", "rollout", "actor"}."""
        self.world_sizes = world_sizes
        self.train_envs = self._make_stage_envs(self.cfg.env.train, "env.train")
        self.eval_envs = self._make_stage_envs(self.cfg.env.eval, "env.eval")
        self.last_obs = [env.reset() for env in self.train_envs]  # [B_stage, D] per stage
        for env in self.train_envs:  # the env keeps the final obs of the episodes to bootstrap; the rollout infers
            env.keep_final_obs(final_obs_of(self.cfg))  # their values
        # env.train.normalize_reward: one scaler per train stage; the trajectory holds the scaled rewards
        self.return_scalers = ([ReturnScaler(env.num_envs, self.cfg.algorithm.gamma) for env in self.train_envs]
                               if self.cfg.env.train.normalize_reward else None)
        self.recent_returns: collections.deque = collections.deque(maxlen=20)  # for "env/return_last20"
        return self.train_envs[0].spec

    def _run_epoch(self, mode: str, envs: list, obs: list[torch.Tensor], n_steps: int, sample_base: int,
                   rollout_channel: Channel, env_channel: Channel, record: bool,
                   video: EvalVideoRecorder | None = None,
                   scalers: list[ReturnScaler] | None = None) -> tuple[list[dict], dict]:
        """One rollout epoch over all stages: n_steps chunk steps (+1 value-only inference when `record`)."""
        rollout_of = self._rank // (self._world_size // self.world_sizes["rollout"])
        expected = f"{self.cfg.rollout.group_name} rank {rollout_of}"
        keys = [(mode, self._rank, k) for k in range(self.stage_num)]
        trajs = [{name: [] for name in TRAJECTORY_KEYS} for _ in range(self.stage_num)]
        stats: dict[str, list[torch.Tensor]] = {"return": [], "episode_len": [], "success_once": []}
        for env in envs:  # an env that renders (PixelReach) draws each frame into the channel's memory: no copy on put
            if hasattr(env.env, "obs_empty"):
                env.env.obs_empty = rollout_channel.empty
        for k, env in enumerate(envs):  # prime the pipeline: every stage's first observation, a clone (after the
            # first epoch it is the last one's final observation, put already for its bootstrap value: Channel.empty)
            first = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, obs[k])
            rollout_channel.put({"obs": first, "env_ids": env.env_ids, "sample_step": sample_base}, key=keys[k])
        pending: list[torch.Tensor | None] = [None] * self.stage_num  # stage k: rows whose final obs was sent
        for t in range(n_steps):
            for k, env in enumerate(envs):
                with span("wait_actions", stage=k):
                    out = env_channel.get(key=keys[k], expected_from=expected)
                self._add_bootstrap(trajs[k], pending[k], out)
                with span("env_step", stage=k):
                    next_obs, rewards, terminations, truncations, ep = env.chunk_step(out["actions"])
                if scalers is not None:  # [B, C] -> [B, C]; episode_stats keep the raw returns
                    rewards = scalers[k](rewards, terminations | truncations)
                # The last observation is only needed for the bootstrap value. Sent before the bookkeeping below, so
                # that the rollout infers while the env records (which only reads next_obs: a frame drawn in the
                # channel's memory is the rollout's to read from its put on, Channel.empty).
                if t + 1 < n_steps or record:
                    msg = {"obs": next_obs, "env_ids": env.env_ids, "sample_step": sample_base + t + 1}
                    final = env.final_obs if record else None
                    pending[k] = None
                    if final is not None:  # (ended [B], obs batch): the reply carries bootstrap_values [B]
                        pending[k], msg["final_obs"] = final
                    rollout_channel.put(msg, key=keys[k])
                if record:
                    tr = trajs[k]
                    tr["obs"].append(out.get("forward_inputs", obs[k]))  # what the actor's model reads
                    tr["actions"].append(out["actions"])
                    tr["logprobs"].append(out["logprobs"])
                    tr["values"].append(out["values"])
                    # raw [B, C] and the version number: reduced once per epoch below, not once per message
                    tr["rewards"].append(rewards)
                    tr["dones"].append((terminations, truncations))
                    tr["versions"].append(out["version"])
                for name, values in ep.items():  # MetaWorld adds success_at_end to the three every env has
                    stats.setdefault(name, []).append(values)
                if video is not None and k == 0:
                    video.add(env, next_obs, rewards, terminations)
                obs[k] = next_obs
        if record:
            for k in range(self.stage_num):
                out = env_channel.get(key=keys[k], expected_from=expected)
                self._add_bootstrap(trajs[k], pending[k], out)
                trajs[k]["values"].append(out["values"])
        stacked = [_stack_trajectory(tr) for tr in trajs] if record else []
        return stacked, {name: torch.cat(v) if v else torch.zeros(0) for name, v in stats.items()}

    def _add_bootstrap(self, tr: dict[str, list], ended: torch.Tensor | None, out: dict) -> None:
        """RLinf's compute_bootstrap_rewards: the last recorded rewards [B, C] of the sub-envs in `ended` [B] gain
        gamma * V(final obs), the value the rollout inferred for the final_obs sent with that step's obs."""
        if ended is None or "bootstrap_values" not in out:
            return
        bootstrap = torch.where(ended, out["bootstrap_values"], 0.0)  # [B]
        tr["rewards"][-1] = tr["rewards"][-1].clone()
        tr["rewards"][-1][:, -1] += self.cfg.algorithm.gamma * bootstrap

    def interact(self, rollout_channel: Channel, env_channel: Channel, actor_channel: Channel,
                 global_step: int) -> dict[str, float]:
        """Collect `rollout_epoch` epochs of trajectories and hand them to the actor ranks; returns env metrics."""
        train = self.cfg.env.train
        n_steps = train.max_steps_per_rollout_epoch // self.chunks
        blocks, all_stats = [], []
        for epoch in range(train.rollout_epoch):
            if not train.auto_reset:
                self.last_obs = [env.reset() for env in self.train_envs]
            sample_base = (global_step * train.rollout_epoch + epoch) * (n_steps + 1)
            trajs, stats = self._run_epoch("train", self.train_envs, self.last_obs, n_steps, sample_base,
                                           rollout_channel, env_channel, record=True,
                                           scalers=self.return_scalers)
            blocks += trajs  # [T(+1), B_stage, ...] per stage; side by side (epoch, then stage): the rank's batch
            all_stats.append(stats)
        per_env_rank, _ = actor_pieces(self._world_size, self.world_sizes["actor"])
        pieces = {name: tree_cat_split([tr[name] for tr in blocks], per_env_rank) for name in TRAJECTORY_KEYS}
        for q in range(per_env_rank):  # piece p of the global batch goes to actor rank p // pieces_per_actor
            actor_channel.put({name: pieces[name][q] for name in TRAJECTORY_KEYS},
                              key=("traj", self._rank * per_env_rank + q))
        names = dict.fromkeys(name for s in all_stats for name in s)  # an epoch may lack a task's key
        stats = {name: torch.cat([s[name] for s in all_stats if name in s]) for name in names}
        n = len(stats["return"])
        self.recent_returns.extend(stats["return"].tolist())
        return {
            "env/num_episodes": float(n),
            "env/return": stats["return"].mean().item() if n else float("nan"),
            "env/episode_len": stats["episode_len"].mean().item() if n else float("nan"),
            "env/success_once": stats["success_once"].mean().item() if n else float("nan"),
            **({"env/success_at_end": stats["success_at_end"].mean().item() if n else float("nan")}
               if "success_at_end" in stats else {}),
            "env/reward": torch.cat([tr["rewards"] for tr in blocks], dim=1).mean().item(),
            "env/return_last20": (sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns
                                  else float("nan")),
            **{f"env/{name}": v.mean().item() for name, v in stats.items() if name.startswith("success_once/")},
        }

    def evaluate(self, rollout_channel: Channel, env_channel: Channel, video_dir: str = "") -> dict[str, float]:
        """One episode per eval sub-env with deterministic actions; unfinished episodes count as failures.
        With a `video_dir`, the first video_cfg.num_videos sub-envs of stage 0 are recorded there as gifs."""
        split = self.cfg.env.eval
        obs = [env.reset() for env in self.eval_envs]
        video = EvalVideoRecorder(split.video_cfg, self.eval_envs[0], obs[0]) if video_dir else None
        n_steps = split.max_steps_per_rollout_epoch // self.chunks
        _, stats = self._run_epoch("eval", self.eval_envs, obs, n_steps, 0, rollout_channel, env_channel,
                                   record=False, video=video)
        if video is not None:
            video.save(video_dir, prefix=f"rank{self._rank}")
        num_envs = sum(env.num_envs for env in self.eval_envs)
        n = len(stats["return"])
        return {
            "eval/success_once_sum": stats["success_once"].sum().item(),
            "eval/return_sum": stats["return"].sum().item(),
            "eval/num_episodes": float(n),
            "eval/num_envs": float(num_envs),
            **({"eval/success_at_end_sum": stats["success_at_end"].sum().item()} if "success_at_end" in stats else {}),
            **per_task_eval_sums([t for env in self.eval_envs for t in getattr(env.env, "tasks", ())], stats),
        }

    def get_state(self) -> dict:
        return {"train_envs": [env.get_state() for env in self.train_envs], "last_obs": self.last_obs,
                "recent_returns": list(self.recent_returns),
                "return_scalers": [s.state_dict() for s in self.return_scalers or []]}

    def set_state(self, state: dict) -> None:
        for env, s in zip(self.train_envs, state["train_envs"], strict=True):
            env.set_state(s)
        self.last_obs = state["last_obs"]
        self.recent_returns.clear()
        self.recent_returns.extend(state["recent_returns"])
        saved = state.get("return_scalers", [])
        if self.return_scalers is not None:
            if len(saved) != len(self.return_scalers):
                raise ValueError("runner.resume_dir: the checkpoint has no reward statistics for "
                                 "env.train.normalize_reward (saved by a run without it)")
            for scaler, s in zip(self.return_scalers, saved, strict=True):
                scaler.load_state_dict(s)

    def close(self) -> None:
        for env in getattr(self, "train_envs", []) + getattr(self, "eval_envs", []):
            env.close()


class RolloutWorker(Worker):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.stage_num = cfg.rollout.pipeline_stage_num
        self.chunks = cfg.actor.model.num_action_chunks

    def init_worker(self, world_sizes: dict[str, int]) -> WeightBufferHandle:
        """Build the policy and the weight buffer; returns the buffer's handle for the actor."""
        self.env_ranks = env_ranks_of_rollout(self._rank, world_sizes["env"], world_sizes["rollout"])
        spec = get_env_spec(self.cfg.env.train)
        model_cfg = self.cfg.actor.model
        if self.cfg.rollout.model.model_path:
            model_cfg = dataclasses.replace(model_cfg, model_path=self.cfg.rollout.model.model_path)
        self.spec = spec
        self.model = build_policy(model_cfg, spec.obs_dim, spec.action_dim, spec.discrete, spec.image_shape,
                                  self.cfg.rollout.sampling_params.temperature_train).to(self.device).eval()
        # the model's weights live in the buffer (zero copy); async PPO's in a copy's (load_newest_weights reads it)
        asynchronous = self.cfg.algorithm.loss_type == "decoupled_actor_critic"
        self.receiver = make_weight_receiver(copy.deepcopy(self.model) if asynchronous else self.model)
        self.noise_width = self.model.noise_width  # uniforms per sample (MLP: per action dim or choice; VLA: per bin)
        return self.receiver.handle()

    def sync_model_from_actor(self, version: int) -> float:
        """Wait until actor rank 0 has written `version` into this rank's buffer; returns seconds waited."""
        return self.receiver.wait_for_version(version, timeout=self.cfg.cluster.timeout_s)

    def load_newest_weights(self, min_version: int) -> int:
        """Async PPO, as a batch starts: the newest published version (>= min_version), copied torn-free; returns it."""
        return self.receiver.load_newest(self.model, min_version, timeout=self.cfg.cluster.timeout_s)

    def _serve(self, mode: str, n_steps: int, rollout_channel: Channel, env_channel: Channel) -> int:
        """n_steps chunk steps of every stage. In train mode the last is the bootstrap step, whose reply the env
        reads only the values of: the value head alone (predict_values, predict_action_batch's values bitwise)."""
        if self.receiver.version < 0:
            raise RuntimeError("rollout has no weights yet: call sync_model_from_actor first")
        seed, latency, rollout = self.cfg.actor.seed, self.cfg.rollout.policy_latency_s, self.cfg.rollout
        producers, model, served = {r: f"{self.cfg.env.group_name} rank {r}" for r in self.env_ranks}, self.model, 0
        with torch.no_grad():
            for t in range(n_steps):
                values_only = mode == "train" and t == n_steps - 1
                for k in range(self.stage_num):
                    for env_rank in self.env_ranks:
                        key = (mode, env_rank, k)
                        with span("wait_obs", stage=k):
                            msg = rollout_channel.get(key=key, expected_from=producers[env_rank])
                        obs = model.prepare_inputs(msg["obs"])  # the VLA tokenizes the instructions here
                        final = model.prepare_inputs(msg["final_obs"]) if "final_obs" in msg else None  # truncations
                        noise = None if mode != "train" or values_only else counter_uniform(
                            seed, msg["env_ids"], msg["sample_step"], self.noise_width).to(self.device)
                        with span("inference", stage=k), autocast(rollout.model.precision, self.device):
                            out = ({"values": model.predict_values(obs)} if values_only
                                   else model.predict_action_batch(obs, noise, mode=mode, bootstrap_obs=final))
                            if latency > 0:  # rollout.policy_latency_s: the wait for a GPU or a server, emulated
                                time.sleep(latency)
                        reply = {"values": out["values"].float().cpu()}
                        if not values_only:  # bf16 autocast may make float actions bf16: fp32 for the env
                            actions = out["actions"]
                            reply |= {"actions": (actions.float() if actions.is_floating_point() else actions).cpu(),
                                      "logprobs": out["logprobs"].float().cpu(), "version": self.receiver.version}
                        if "forward_inputs" in out and mode == "train":
                            reply["forward_inputs"] = tree_map(lambda t: t.cpu(), out["forward_inputs"])
                        if final is not None:  # V(final obs) [B]: from the action call, or its own at the last step
                            if values_only:
                                with span("bootstrap_value", stage=k), autocast(rollout.model.precision, self.device):
                                    out["bootstrap_values"] = model.predict_values(final)
                            reply["bootstrap_values"] = out["bootstrap_values"].float().cpu()
                        env_channel.put(reply, key=key)
                        served += len(msg["env_ids"])
        return served

    def generate(self, rollout_channel: Channel, env_channel: Channel) -> dict[str, float]:
        """Serve every chunk step of the training rollout epochs, plus one bootstrap-value inference per epoch."""
        train = self.cfg.env.train
        n_steps = train.max_steps_per_rollout_epoch // self.chunks + 1
        start = time.monotonic()
        served = sum(self._serve("train", n_steps, rollout_channel, env_channel) for _ in range(train.rollout_epoch))
        return {"rollout/samples": float(served), "rollout/weight_version": float(self.receiver.version),
                "time/rollout/generate": time.monotonic() - start}

    def evaluate(self, rollout_channel: Channel, env_channel: Channel) -> None:
        n_steps = self.cfg.env.eval.max_steps_per_rollout_epoch // self.chunks
        self._serve("eval", n_steps, rollout_channel, env_channel)

    def get_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def close(self) -> None:
        if hasattr(self, "receiver"):  # init_worker may have failed before creating it
            self.receiver.close()
