"""Train an embodied policy: YAML -> Cluster -> placement -> actor / rollout / env groups -> EmbodiedRunner (async PPO:
AsyncEmbodiedRunner; or, with
runner.task_type: reasoning, a language model: actor / rollout / reward groups -> ReasoningRunner).

    python -m rlinf_mini.train --config configs/embodied.yaml                      # CPU fake env, a few minutes
    python -m rlinf_mini.train --config configs/cartpole.yaml --runner.max-epochs 50
    python -m rlinf_mini.train --config configs/embodied.yaml --help               # every key, with its meaning
    python -m rlinf_mini.train --config configs/embodied.yaml --explain            # the plan; starts nothing
    python -m rlinf_mini.train --config configs/math.yaml        # runner.task_type reasoning: GRPO on a tiny GPT-2

Bad input (an unknown key, a wrong type, a bad placement, batch sizes that do not divide) is one line on stderr and
exit code 2, before any worker process starts. A failing worker is reported with its group, rank and traceback, and
every process and shared-memory segment is gone when this returns.

RLinf counterpart: `examples/embodiment/train_embodied_agent.py` (reasoning: `examples/reasoning/main_grpo.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
from pathlib import Path

from rlinf_mini.config import (
    ConfigError,
    TrainConfig,
    check_batch_arithmetic,
    check_precision,
    config_source,
    load_config,
    save_config,
)
from rlinf_mini.scheduler import faults


def _preload(cfg: TrainConfig) -> tuple[str, ...]:
    """What every rank imports, imported once by the local backend's fork server: the model's module. The VLA's and
    the language model's pull in transformers (seconds of CPU per process); the MLP needs only torch."""
    if cfg.runner.task_type == "reasoning":
        return ("rlinf_mini.models.tiny_lm",)
    return ("rlinf_mini.models.tiny_vla",) if cfg.actor.model.model_type == "tiny_vla" else ()


def _place(plan, cfg: TrainConfig, source: str, placement_cls, components: tuple[str, ...]) -> None:
    """A run's devices and placement, both kinds of run: the GPUs seen, num_devices resolved (-1: every GPU), the
    placement of `components`, their world sizes and the device plan that --explain prints; precision checked."""
    import torch

    from rlinf_mini.scheduler import devices

    plan.num_gpus = torch.cuda.device_count()
    plan.num_devices = devices.resolve_num_devices(cfg.cluster.num_devices, plan.num_gpus)
    plan.placement = placement_cls(cfg.cluster.component_placement, plan.num_devices)
    check_precision(cfg, plan.num_gpus, source)
    plan.device_plan = devices.device_plan({c: plan.placement.get_strategy(c) for c in components}, plan.num_devices,
                                           plan.num_gpus, devices.visible_gpus(os.environ, plan.num_gpus),
                                           num_nodes=cfg.cluster.num_nodes,
                                           threads_per_device=cfg.cluster.threads_per_device)
    plan.world_sizes = {c: plan.placement.get_world_size(c) for c in components}


def _new_run_dir(cfg: TrainConfig, source: str) -> Path:
    """The run's folder, refused if an earlier run wrote there and this one does not resume it: two runs in one folder
    would mix their metrics, and `resume_dir: auto` would find the old one's checkpoints."""
    from rlinf_mini.runners.base import holds_a_run

    run_dir = Path(cfg.runner.logger.log_path) / cfg.runner.logger.experiment_name
    if cfg.runner.resume_dir is None and holds_a_run(run_dir):
        raise ConfigError(f"{source}: runner.logger.experiment_name: {run_dir} already holds a run; resume it "
                          f"with runner.resume_dir=auto or pick another runner.logger.experiment_name")
    return run_dir


@contextlib.contextmanager
def _read_as_config_error(source: str):
    """A ValueError from reading what the config names (a model folder, a dataset) is a config error: re-raised as
    ConfigError, one line naming the file and the key. Other exceptions pass with their traceback."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"{source}: {str(e).splitlines()[0]}") from None


class RunPlan:
    """Everything decided before any process starts: the placement, the world sizes, the run folder. Planning writes
    nothing (--explain neither); `prepare()`, just before the workers start, makes the VLA's model folder."""

    def __init__(self, cfg: TrainConfig, source: str):
        from rlinf_mini.envs import get_env_spec
        from rlinf_mini.models import build_policy
        from stages.placement import HybridComponentPlacement

        self.cfg, self.source, self.prepared = cfg, source, False
        _place(self, cfg, source, HybridComponentPlacement, ("env", "rollout", "actor"))
        check_batch_arithmetic(cfg, self.world_sizes["env"], self.world_sizes["rollout"],
                               self.world_sizes["actor"], source)
        spec = get_env_spec(cfg.env.train, "env.train")
        eval_spec = get_env_spec(cfg.env.eval, "env.eval")
        if eval_spec != spec:
            raise ConfigError(f"{source}: env.eval: its spaces {eval_spec} differ from env.train's {spec}")
        path = cfg.actor.model.model_path
        # a VLA folder that does not exist yet is made by prepare(); checked here as the fresh model it will hold
        self.model_to_make = path if cfg.actor.model.model_type == "tiny_vla" and path and not Path(path).exists() \
            else ""
        model_cfg = dataclasses.replace(cfg.actor.model, model_path="") if self.model_to_make else cfg.actor.model
        with _read_as_config_error(source):  # a bad model_path fails here
            policy = build_policy(model_cfg, spec.obs_dim, spec.action_dim, spec.discrete, image_shape=spec.image_shape)
        # /dev/shm the rollout's weight buffers take (stages/sync.py: one per rollout rank, reserved at creation)
        self.weight_bytes = sum(t.numel() * t.element_size() for t in policy.state_dict().values())
        self.shm_bytes = self.world_sizes["rollout"] * self.weight_bytes
        self.preload = _preload(cfg)
        if cfg.rollout.model.model_path:
            try:
                build_policy(dataclasses.replace(cfg.actor.model, model_path=cfg.rollout.model.model_path),
                             spec.obs_dim, spec.action_dim, spec.discrete, image_shape=spec.image_shape)
            except ValueError as e:
                raise ConfigError(f"{source}: rollout.model.model_path: {str(e).split(': ', 1)[-1]}") from None
        self.run_dir = _new_run_dir(cfg, source)

    def prepare(self) -> None:
        """The files the run needs before its workers start: the VLA's initial HF folder where model_path names a
        missing one (as `python -m rlinf_mini.models.make_tiny_vla`). A second call does nothing."""
        if self.model_to_make and not Path(self.model_to_make).exists():
            from rlinf_mini.models.make_tiny_vla import create_tiny_vla

            create_tiny_vla(self.cfg, self.model_to_make)
        self.prepared = True


def launch(cfg: TrainConfig, plan: RunPlan, cluster) -> EmbodiedRunner:  # noqa: F821
    """Start the three worker groups where the placement says, and wire them into a runner (not yet initialized):
    algorithm.loss_type decoupled_actor_critic selects asynchronous PPO's runner and actor."""
    from rlinf_mini.runners.embodied import EmbodiedRunner
    from rlinf_mini.runners.embodied_async import AsyncEmbodiedRunner
    from stages.rollout import EnvWorker, RolloutWorker
    from stages.train import ActorWorker
    from stages.train_async import AsyncActorWorker

    asynchronous = cfg.algorithm.loss_type == "decoupled_actor_critic"

    if not plan.prepared:
        plan.prepare()
    placement = plan.placement
    actor = (AsyncActorWorker if asynchronous else ActorWorker).create_group(cfg).launch(
        cluster, placement_strategy=placement.get_strategy("actor"), name=cfg.actor.group_name)
    rollout = RolloutWorker.create_group(cfg).launch(
        cluster, placement_strategy=placement.get_strategy("rollout"), name=cfg.rollout.group_name)
    env = EnvWorker.create_group(cfg).launch(
        cluster, placement_strategy=placement.get_strategy("env"), name=cfg.env.group_name)
    runner_cls = AsyncEmbodiedRunner if asynchronous else EmbodiedRunner
    return runner_cls(cfg, actor=actor, rollout=rollout, env=env, cluster=cluster, run_dir=plan.run_dir)


# --- reasoning (runner.task_type: reasoning) -------------------------------------------------------------------------


class ReasoningRunPlan:
    """The reasoning run's checks, before any process starts: placement (actor, rollout, reward), batch arithmetic,
    the run folder. Planning writes nothing; `prepare()`, just before the workers start, makes the arithmetic JSONL
    and the model folder when missing and reads the prompt datasets (train_set, val_set)."""

    def __init__(self, cfg: TrainConfig, source: str):
        from rlinf_mini.config import check_reasoning_batch_arithmetic
        from stages.placement import ReasoningComponentPlacement

        self.cfg, self.source, self.prepared = cfg, source, False
        _place(self, cfg, source, ReasoningComponentPlacement, ("rollout", "reward", "actor"))
        check_reasoning_batch_arithmetic(cfg, self.world_sizes["rollout"], self.world_sizes["reward"],
                                         self.world_sizes["actor"], source)
        self.run_dir = _new_run_dir(cfg, source)  # before the data and the model are made: seconds of warm start
        self.preload = _preload(cfg)

    def prepare(self) -> None:
        """The data and the model folder (made when missing), the datasets read, the /dev/shm the weights will take.
        Raises ConfigError for a file that does not fit the config. A second call does nothing."""
        if self.prepared:
            return
        from rlinf_mini.data.prompt_dataset import PromptDataset
        from rlinf_mini.models.make_tiny_lm import create_tiny_lm, ensure_arithmetic_data
        from rlinf_mini.models.tiny_lm import load_tokenizer

        cfg, source = self.cfg, self.source
        with _read_as_config_error(source):
            ensure_arithmetic_data(cfg)
            path = cfg.actor.model.model_path
            if not Path(path).exists():  # the initial HF folder, as `python -m rlinf_mini.models.make_tiny_lm`
                if cfg.actor.model.model_type == "smollm2":
                    from rlinf_mini.models.make_smollm2 import create_smollm2

                    create_smollm2(path)
                else:
                    create_tiny_lm(cfg, path)
            tokenizer = load_tokenizer(path)
            self.train_set = PromptDataset.from_files(cfg.data.train_data_paths, cfg.data, tokenizer)
            self.val_set = PromptDataset.from_files(cfg.data.val_data_paths, cfg.data, tokenizer,
                                                    "data.val_data_paths")
        # /dev/shm the rollout's weight buffers take (stages/sync.py: one per rollout rank): the model's weights
        self.weight_bytes = sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
        self.shm_bytes = self.world_sizes["rollout"] * self.weight_bytes
        for key, dataset in (("data.train_data_paths", self.train_set), ("data.val_data_paths", self.val_set)):
            if note := dataset.dropped_note(key, cfg.data.max_prompt_length):
                print(note, file=sys.stderr)
        if cfg.data.rollout_batch_size > len(self.train_set):
            raise ConfigError(f"{source}: data.rollout_batch_size: {cfg.data.rollout_batch_size} exceeds the "
                              f"{len(self.train_set)} train prompts")
        self.prepared = True


def launch_reasoning(cfg: TrainConfig, plan: ReasoningRunPlan, cluster):
    """Start the rollout, reward and actor groups where the placement says, and wire them into a ReasoningRunner."""
    from rlinf_mini.runners.reasoning import ReasoningRunner
    from stages.reasoning_reward import ReasoningRewardWorker
    from stages.reasoning_rollout import ReasoningRolloutWorker
    from stages.reasoning_train import ReasoningActorWorker

    plan.prepare()
    p = plan.placement
    rollout = ReasoningRolloutWorker.create_group(cfg).launch(
        cluster, placement_strategy=p.get_strategy("rollout"), name=cfg.rollout.group_name)
    reward = ReasoningRewardWorker.create_group(cfg).launch(
        cluster, placement_strategy=p.get_strategy("reward"), name=cfg.reward.group_name)
    actor = ReasoningActorWorker.create_group(cfg).launch(
        cluster, placement_strategy=p.get_strategy("actor"), name=cfg.actor.group_name)
    return ReasoningRunner(cfg, actor=actor, rollout=rollout, reward=reward, cluster=cluster, run_dir=plan.run_dir,
                           train_set=plan.train_set, val_set=plan.val_set)


# ----------------------------------------------------------------------------------------------------------------------


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the driver: unwinding stops every worker."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_on_signals(cluster) -> dict:
    """First SIGINT/SIGTERM: raise Interrupted, so `finally: cluster.shutdown()` stops the workers (within seconds;
    a checkpoint being written stays a .tmp folder, the last complete one is untouched). A second one kills every
    worker at once. Returns the previous handlers."""

    def second(signum, frame):
        print(f"{signal.Signals(signum).name} again: killing every worker now", file=sys.stderr, flush=True)
        cluster.kill_now()
        os._exit(128 + signum)

    def first(signum, frame):
        signal.signal(signal.SIGINT, second)
        signal.signal(signal.SIGTERM, second)
        raise Interrupted(signum)

    return {s: signal.signal(s, first) for s in (signal.SIGINT, signal.SIGTERM)}


def build_and_run(cfg: TrainConfig, plan: RunPlan | ReasoningRunPlan) -> list[dict[str, float]]:
    """Start the workers, train, and stop everything (also on error, Ctrl-C or SIGTERM); the per-step metrics."""
    return run_to_the_end(cfg, plan).history


def run_to_the_end(cfg: TrainConfig, plan: RunPlan | ReasoningRunPlan):
    """build_and_run, returning the runner (its history, trace spans and schedule log, for tests and tutorials)."""
    from rlinf_mini.scheduler import shm
    from rlinf_mini.scheduler.cluster import Cluster

    if not plan.prepared:
        plan.prepare()  # the files the run needs (a model folder, the reasoning data): just before workers start
    shm.check_free(plan.shm_bytes, f"the weight buffers of {plan.world_sizes['rollout']} rollout rank(s)")
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, plan.run_dir / "config.yaml")
    if plan.device_plan.note:
        print(plan.device_plan.note, file=sys.stderr)  # once, at start
    cluster = Cluster(cfg.cluster, preload=plan.preload, device_plan=plan.device_plan)
    previous = _stop_on_signals(cluster) if threading.current_thread() is threading.main_thread() else {}
    try:
        runner = (launch_reasoning if isinstance(plan, ReasoningRunPlan) else launch)(cfg, plan, cluster)
        runner.init_workers()
        runner.run()
        return runner
    finally:
        try:
            cluster.shutdown()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--explain" in argv:  # not a config key: print the plan (rlinf_mini/explain.py) and start nothing
        from rlinf_mini.explain import main as explain_main

        return explain_main([a for a in argv if a != "--explain"])
    try:
        cfg = load_config(argv)  # imports only yaml and tyro: --help and config errors answer at once
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg.cluster.backend == "local" and cfg.cluster.rank_start == "forkserver" and "torch" not in sys.modules:
        # The local backend's fork server, forked from this process now, before anything computes: it shares this
        # process's imports instead of making its own (local.start_fork_server_here). OpenMP reads its wait policy
        # when torch loads, here, for the ranks too: passive, so that idle threads of ranks sharing cores sleep
        # instead of spinning (what the stdlib-started server is given). A config RunPlan refuses leaves it unused;
        # it ends with this process.
        from rlinf_mini.scheduler import local

        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        local.start_fork_server_here(_preload(cfg))
    from rlinf_mini.envs import EnvError
    from rlinf_mini.scheduler.shm import ShmFullError
    from rlinf_mini.scheduler.worker import WorkerDiedError, WorkerError
    from stages.placement import PlacementError

    source = config_source(argv)
    try:
        if os.environ.get(faults.ENV_VAR):  # a malformed fault plan fails here, not in every worker
            with _read_as_config_error(source):
                faults.parse(os.environ[faults.ENV_VAR])
        plan = (ReasoningRunPlan if cfg.runner.task_type == "reasoning" else RunPlan)(cfg, source)
        plan.prepare()  # the files it needs, before any worker starts: what they hold is still a config error
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (PlacementError, EnvError) as e:  # a placement or env the config names that cannot be made
        print(f"error: {source}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        history = build_and_run(cfg, plan)
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"interrupted: all workers stopped ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum
    except ConfigError as e:  # what only the cluster can tell (a Ray cluster's nodes and GPUs): before any worker
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ShmFullError as e:  # the driver's check: before any worker started
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (WorkerError, WorkerDiedError, TimeoutError) as e:
        full = ShmFullError.find_in(str(e))  # a worker's reservation failed: that line says what to do
        print(f"error: {full or e}", file=sys.stderr)
        return 1
    evals = [h for h in history if "eval/success_once" in h]
    summary = f"done: {len(history)} steps logged in {plan.run_dir}/metrics.jsonl"
    if evals:
        first, last = evals[0], evals[-1]
        summary += (f"; eval success {first['eval/success_once']:.2f} -> {last['eval/success_once']:.2f}, "
                    f"eval return {first['eval/return']:.3g} -> {last['eval/return']:.3g}")
    accuracy = [h["eval/accuracy"] for h in history if "eval/accuracy" in h]
    if accuracy:
        summary += f"; eval accuracy {accuracy[0]:.3f} -> {accuracy[-1]:.3f}"
    print(summary, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
