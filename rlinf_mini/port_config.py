"""Port an RLinf YAML in one step: say what carries over, what is replaced and what is ignored on purpose, and write
a YAML that runs.

    python -m rlinf_mini.port_config RLINF.yaml [-o OUT.yaml] [--no-write]   # the report; OUT defaults to ported_X
    python -m rlinf_mini.port_config --key-table RLINF_CONFIG_DIR             # every key of a folder, as Markdown

The file is read as RLinf reads it (its Hydra `defaults:` list relative to the file, `${a.b}` interpolations),
then every leaf key gets one verdict: carried (same name, same meaning here), replaced (a simulator or model that
is not installed becomes rlinf_mini's fake env or tiny VLA; precisions become '32'), ignored (the feature is left out
on purpose, with the reason) or dropped (no counterpart). The written file holds the full resolved config.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import importlib.util
import re
import sys
import typing
from pathlib import Path
from typing import Any

from rlinf_mini.config import (
    ConfigError,
    InitParams,
    TrainConfig,
    config_from_tree,
    read_yaml_tree,
    save_config,
    unknown_keys,
)

# RLinf keys left out on purpose: (glob over the key path, with env.* for env.train / env.eval) -> why. First match.
IGNORED: list[tuple[str, str]] = [
    ("hydra.*", "Hydra's own settings (output folder, search path); defaults: lists are read relative to the file"),
    ("*enable_offload", "offload is left out: rlinf_mini's models fit in memory beside each other"),
    ("actor.fsdp_config.*", "no FSDP: the actor is data-parallel with one all-reduce of the gradient"),
    ("actor.megatron.*", "no Megatron: the actor is data-parallel with one all-reduce of the gradient"),
    ("actor.training_backend", "one training backend: plain PyTorch"),
    ("weight_syncer.*", "weight sync is one versioned bucket copy into the rollout's buffers (stages/sync.py)"),
    ("runner.logger.project_name", "names a wandb/swanlab project; rlinf_mini logs to TensorBoard and metrics.jsonl "
                                   "under log_path/experiment_name"),
    ("runner.only_eval", "left out: every run trains (evaluation every val_check_interval steps)"),
    ("runner.ckpt_path", "left out: start from runner.resume_dir or actor.model.model_path"),
    ("runner.per_worker_log*", "left out: workers log to the driver's console"),
    ("rollout.backend", "the rollout runs the PyTorch module itself"),
    ("rollout.generation_backend", "the rollout runs the PyTorch module itself"),
    ("rollout.enable_torch_compile", "left out: no torch.compile"),
    ("rollout.enable_cuda_graph", "left out: no CUDA graphs"),
    ("rollout.sampling_params.*", "left out: training samples at temperature_train, evaluation takes the argmax"),
    ("algorithm.kl_penalty", "RLinf 0.3.0 reads algorithm.kl_penalty_type; nothing reads this key"),
    ("algorithm.reward_type", "one reward per chunk step (RLinf's chunk_level; action_level is the same at "
                              "num_action_chunks 1)"),
    ("algorithm.logprob_type", "one log-prob per chunk step, summed over the chunk's actions (chunk_level)"),
    ("algorithm.entropy_type", "one entropy per chunk step (chunk_level)"),
    ("algorithm.loss_agg_func", "losses are a masked mean over the samples (RLinf's token-mean)"),
    ("algorithm.filter_rewards", "left out: no group filtering by reward"),
    ("algorithm.rewards_*_bound", "left out: no group filtering by reward"),
    ("actor.optim.critic_warmup_steps", "left out: no critic warm-up (the policy trains from step 1)"),
    ("actor.optim.*", "left out: the schedule is actor.optim.lr_scheduler's (constant or cosine, linear warm-up)"),
    ("actor.critic_optim.*", "off-policy algorithms (SAC, CrossQ) are left out: no separate critic optimizer"),
    ("actor.value_optim.*", "left out: the value head's optimizer is actor.optim (value_lr)"),
    ("actor.*sft*", "no offline data or SFT co-training"),
    ("algorithm.reward_coef", "left out: rewards are used as the env returns them (no scaling)"),
    ("algorithm.clip_log_ratio_*", "left out: no log-ratio clamp (RLinf passes it for GR00T models only)"),
    ("algorithm.use_fixed_reset_state_ids", "rlinf_mini reads env.*.use_fixed_reset_state_ids"),
    ("algorithm.sampling_params.*", "left out: training samples at rollout.sampling_params.temperature_train"),
    ("algorithm.*", "belongs to an algorithm rlinf_mini leaves out (SAC, CrossQ, IQL, DAgger, NFT, DPO: replay / "
                    "demo buffers, target networks, entropy tuning)"),
    ("cluster.node_groups", "one kind of node: devices are cluster.num_devices (per node: cluster.num_nodes)"),
    ("rollout.collect_*", "left out: transitions for off-policy replay"),
    ("rollout.expert_model.*", "left out: DAgger's expert"),
    ("rollout.model.*", "the rollout runs the actor's model (weights synced each step); no model of its own"),
    ("rollout.*", "a setting of RLinf's inference engines; the rollout runs the PyTorch module itself"),
    ("runner.*", "left out: a runner mode rlinf_mini does not have (eval-only, data collection, async, SFT)"),
    ("seed", "seeds are per component: actor.seed, env.*.seed"),
    ("reward.*", "no reward-model workers: rewards come from the env"),
    ("critic.*", "no separate critic model: the value head sits on the policy (actor.model.add_value_head)"),
    ("data.*", "no offline data or SFT co-training"),
    ("actor.model.*", "a setting of RLinf's own model implementations; rlinf_mini's MLP and tiny VLA have none"),
    ("env.*.init_params.*", "a constructor argument of RLinf's simulator (rlinf_mini passes init_params on to "
                            "gymnasium envs only)"),
    ("env.*", "a setting of RLinf's simulator wrappers; rlinf_mini's envs take none"),
]
SUPPORTED_ADV, SUPPORTED_LOSS = ("gae", "grpo", "reinpp"), ("actor_critic", "actor")
PORTED_CAMERA = 40
"""Side in pixels of the MetaWorld camera frames a ported image config renders for the tiny VLA (patch size 4)."""
IMAGE_MODELS = {"mlp_policy": False}  # every other RLinf model_type reads images: the tiny VLA stands in for it


def leaf_items(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, value) of every leaf; component_placement and empty mappings count as one leaf."""
    out = []
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v and path != "cluster.component_placement":
            out += leaf_items(v, path)
        else:
            out.append((path, v))
    return out


def _set(tree: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[last] = value


def _generic(path: str) -> str:
    return re.sub(r"^env\.(train|eval)\.", "env.*.", path)


def _known(path: str, value: Any) -> bool:
    tree: dict = {}
    _set(tree, path, value if not isinstance(value, dict) else dict(value))
    return not unknown_keys(TrainConfig, tree)


def _default(path: str) -> Any:
    node: Any = TrainConfig()
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _simulator_argument(path: str) -> bool:
    """env.*.init_params.X that is not one of rlinf_mini's InitParams fields: a simulator's constructor argument."""
    _, found, rest = path.partition(".init_params.")
    return bool(found) and rest.split(".")[0] not in typing.get_type_hints(InitParams)


def _ignored(path: str) -> str | None:
    generic = _generic(path)
    return next((why for pattern, why in IGNORED if fnmatch.fnmatchcase(generic, pattern)), None)


def _max_device(placement: dict) -> int | None:
    """The highest device index named in RLinf placement strings ('0-7', '0,2', '0-1:0-3'); None for 'all'."""
    numbers = [int(n) for v in placement.values() for n in re.findall(r"\d+", str(v).split(":")[0])]
    return max(numbers) if numbers else None


# Keys that only the reasoning half reads: in an embodied file they are ignored (with IGNORED's reason), not carried.
REASONING_ONLY = ("algorithm.sampling_params.", "algorithm.loss_agg_func", "algorithm.recompute_logprobs",
                  "algorithm.rollout_batch_size_per_gpu", "data.", "reward.", "runner.seq_length")


class Port:
    """The verdicts on one RLinf file and the tree rlinf_mini reads."""

    def __init__(self, file: str | Path):
        self.file = Path(file)
        self.rlinf = read_yaml_tree(self.file)
        self.reasoning = (self.rlinf.get("runner") or {}).get("task_type") == "reasoning"
        self.tree: dict = {}
        self.carried: list[tuple[str, Any]] = []
        self.replaced: list[tuple[str, Any, Any, str]] = []  # path, RLinf value, rlinf_mini value, why
        self.ignored: list[tuple[str, str]] = []
        self.dropped: list[str] = []
        for path, value in leaf_items(self.rlinf):
            self._one(path, value)
        self._replace_what_is_not_here()

    def _one(self, path: str, value: Any) -> None:
        embodied_skips = not self.reasoning and path.startswith(REASONING_ONLY)
        if _known(path, value) and not _simulator_argument(path) and not embodied_skips:
            single: dict = {}
            _set(single, path, value)
            try:
                config_from_tree(single, "")
                null_for_default = False
            except ConfigError:  # a misfit other than null (env_type 'libero') is replaced below or named by config()
                null_for_default = value is None
            if null_for_default:
                default = _default(path)  # RLinf's null for "not set": rlinf_mini's default says the same
                _set(self.tree, path, default)
                self.replaced.append((path, None, default, "null: rlinf_mini's default"))
                return
            _set(self.tree, path, value)
            self.carried.append((path, value))
        elif why := _ignored(path):
            self.ignored.append((path, why))
        else:
            self.dropped.append(path)

    def _replace(self, path: str, new: Any, why: str) -> None:
        old = self._get(path)
        if old == new:
            return
        _set(self.tree, path, new)
        self.carried = [(p, v) for p, v in self.carried if p != path]
        self.replaced.append((path, old, new, why))

    def _get(self, path: str) -> Any:
        node: Any = self.rlinf
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def _replace_what_is_not_here(self) -> None:
        algo = self.rlinf.get("algorithm", {})
        if algo.get("adv_type", "gae") not in SUPPORTED_ADV or algo.get("loss_type", "actor_critic") not in \
                SUPPORTED_LOSS + ("decoupled_actor_critic",):
            raise ConfigError(f"{self.file}: algorithm.adv_type {algo.get('adv_type')!r} / loss_type "
                              f"{algo.get('loss_type')!r}: rlinf_mini has on-policy PPO, GRPO and Reinforce++ only "
                              f"(adv_type {', '.join(SUPPORTED_ADV)}; loss_type {', '.join(SUPPORTED_LOSS)})")
        if algo.get("loss_type") == "decoupled_actor_critic" and algo.get("staleness_threshold") is None:
            self._replace("algorithm.staleness_threshold", 1, "async PPO needs a bound (RLinf's actor fails on a "
                                                              "null one); 1, as RLinf's async examples")
        model_type = self._get("actor.model.model_type") or "mlp_policy"
        image = IMAGE_MODELS.get(model_type, True)
        if model_type not in ("mlp_policy", "tiny_vla"):
            self._replace("actor.model.model_type", "tiny_vla", f"{model_type} is not in rlinf_mini: its tiny VLA "
                                                                "(images + instruction -> action tokens) stands in")
        for key in ("actor.model.model_path", "rollout.model.model_path"):
            if self._get(key):
                new = "results/ported_tiny_vla" if key.startswith("actor") and image else ""
                self._replace(key, new, "the RLinf checkpoint is not here" +
                              ("; the train entry creates a fresh tiny VLA there" if new else ""))
        for key in ("actor.model.precision", "rollout.model.precision"):
            if self._get(key) not in (None, "32", 32):
                self._replace(key, "32", "only float32 (CPU); mixed precision is left out")
        have = {sim: importlib.util.find_spec(module) is not None
                for sim, module in (("maniskill", "mani_skill"), ("metaworld", "metaworld"))}
        for split in ("train", "eval"):
            env_type = self._get(f"env.{split}.env_type")
            if env_type == "metaworld" and have["metaworld"]:
                self._port_metaworld(split, image)
                continue
            if env_type in (None, "fake", "gymnasium") or (env_type == "maniskill" and have["maniskill"]):
                continue
            fake_id = "PixelReach-v0" if image else "FakeReach-v0"
            self._replace(f"env.{split}.env_type", "fake", f"the {env_type} simulator is not installed: rlinf_mini's "
                                                           f"{fake_id} (a CPU env, same interface) stands in")
            self._replace(f"env.{split}.init_params.id", fake_id, f"{env_type}'s task id means nothing to the fake env")
            if split == "eval" and self._get("env.eval.auto_reset"):
                self._replace("env.eval.auto_reset", False, "rlinf_mini evaluates one episode per sub-env "
                                                            "(eval/success_once is a fraction of the eval envs)")
            if not image and self._get(f"env.{split}.video_cfg.save_video"):
                self._replace(f"env.{split}.video_cfg.save_video", False, "FakeReach-v0 draws no frames")
            for key in ("actor.model.obs_dim", "actor.model.action_dim"):
                if self._get(key) and split == "train":
                    self._replace(key, 0, "taken from the env that replaces the simulator")
        backends = self._get("runner.logger.logger_backends")
        if isinstance(backends, list) and any(b != "tensorboard" for b in backends):
            self._replace("runner.logger.logger_backends", [b for b in backends if b == "tensorboard"],
                          "only tensorboard (and metrics.jsonl, always written)")
        placement = self._get("cluster.component_placement")
        if isinstance(placement, dict) and _max_device(placement) is not None:
            _set(self.tree, "cluster.num_devices", _max_device(placement) + 1)
            self.replaced.append(("cluster.num_devices", None, _max_device(placement) + 1,
                                  "rlinf_mini's device count: one past the highest device the placement names "
                                  "(virtual CPU devices without GPUs)"))

    def _port_metaworld(self, split: str, image: bool) -> None:
        """MetaWorld runs here (CPU): the VLA sees camera frames at the tiny VLA's size, the MLP the 39-dim state."""
        if split == "eval" and self._get("env.eval.auto_reset"):
            self._replace("env.eval.auto_reset", False, "rlinf_mini evaluates one episode per sub-env "
                                                        "(eval/success_once is a fraction of the eval envs)")
        mode = "rgb" if image else "state"
        if self._get(f"env.{split}.init_params.obs_mode") != mode:
            self._replace(f"env.{split}.init_params.obs_mode", mode, "what the model reads: camera frames for an "
                          "image model, the 39-dim state for the MLP")
        for key in ("camera_heights", "camera_widths"):
            if image and self._get(f"env.{split}.init_params.{key}") not in (None, PORTED_CAMERA):
                self._replace(f"env.{split}.init_params.{key}", PORTED_CAMERA, f"the tiny VLA's {PORTED_CAMERA} x "
                              f"{PORTED_CAMERA} frames (a {self._get(f'env.{split}.init_params.{key}')}-pixel side "
                              "is for pi0 on a GPU)")

    def config(self) -> TrainConfig:
        return config_from_tree(self.tree, f"{self.file} (ported)")

    def report(self) -> str:
        lines = [f"{self.file}: {len(self.carried)} keys carried over, {len(self.replaced)} replaced, "
                 f"{len(self.ignored)} ignored on purpose, {len(self.dropped)} with no counterpart"]
        lines += ["", "carried over (same name, same meaning):"]
        lines += [f"  {p} = {v!r}" for p, v in self.carried]
        lines += ["", "replaced:"] + [f"  {p}: {o!r} -> {n!r}  ({why})" for p, o, n, why in self.replaced]
        by_reason: dict[str, list[str]] = collections.defaultdict(list)
        for p, why in self.ignored:
            by_reason[why].append(p)
        lines += ["", "ignored on purpose:"] + [f"  {', '.join(ps)}: {why}" for why, ps in by_reason.items()]
        lines += ["", "no counterpart in rlinf_mini (dropped):"] + [f"  {p}" for p in self.dropped]
        return "\n".join(lines)


def verdict(path: str, value: Any = 1) -> str:
    """What rlinf_mini does with one RLinf key of an embodied config, in a few words (for the key table)."""
    generic = _generic(path)
    if generic in ("actor.model.model_type", "actor.model.model_path", "rollout.model.model_path",
                   "actor.model.obs_dim", "actor.model.action_dim", "env.*.env_type", "env.*.init_params.id"):
        return "carried when rlinf_mini has it; else replaced (the fake env / tiny VLA stand in)"
    if generic in ("actor.model.precision", "rollout.model.precision"):
        return "carried if '32', else replaced by '32' (float32 only)"
    if _known(path, value) and ".init_params." not in path and not path.startswith(REASONING_ONLY):
        return "carried (same name, same meaning)"
    return f"ignored: {why}" if (why := _ignored(path)) else "dropped: no counterpart"


def key_table(folder: Path) -> str:
    """Markdown: every leaf key of every top-level YAML in `folder`, how many files use it, what rlinf_mini does."""
    counts: collections.Counter[str] = collections.Counter()
    files = sorted(folder.glob("*.yaml"))
    for f in files:
        counts.update({_generic(p) for p, _ in leaf_items(read_yaml_tree(f))})
    rows = [f"| `{k}` | {n} | {verdict(k.replace('env.*.', 'env.train.'))} |" for k, n in sorted(counts.items())]
    return "\n".join([f"Every key of RLinf's {len(files)} example configs in `{folder}/` ({len(counts)} keys; "
                      f"`env.*` = env.train and env.eval), generated by `python -m rlinf_mini.port_config --key-table "
                      f"DIR`.", "", "| key | files | rlinf_mini |", "|---|---|---|", *rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlinf_mini.port_config", description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", help="an RLinf YAML, e.g. examples/embodiment/config/maniskill_ppo_mlp.yaml")
    parser.add_argument("-o", "--output", help="where to write the rlinf_mini YAML (default: ported_<name>.yaml)")
    parser.add_argument("--no-write", action="store_true", help="print the report only")
    parser.add_argument("--key-table", metavar="DIR", help="print the Markdown table of every key in DIR's YAMLs")
    args = parser.parse_args(argv)
    try:
        if args.key_table:
            print(key_table(Path(args.key_table)), end="")
            return 0
        if not args.file:
            parser.error("give an RLinf YAML file (or --key-table DIR)")
        port = Port(args.file)
        cfg = port.config()
        print(port.report())
        if not args.no_write:
            out = Path(args.output or f"ported_{Path(args.file).name}")
            save_config(cfg, out)
            out.write_text(f"# ported from {args.file} by `python -m rlinf_mini.port_config` (the report says what "
                           f"changed)\n" + out.read_text())
            print(f"\nwrote {out}; run it: python -m rlinf_mini.train --config {out}")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

