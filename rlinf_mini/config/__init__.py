"""The run's configuration: tyro dataclasses that mirror RLinf's YAML schema, section by section.

    cfg = load_config(["--config", "configs/embodied.yaml", "--actor.optim.lr", "1e-3"])

Precedence: dataclass defaults < YAML file (with its `defaults:` list) < `key=value` < `--key value`. The YAML is read
strictly and composed by OmegaConf as Hydra does for RLinf (interpolation, RLinf's resolvers); an unknown key or a wrong
type is a `ConfigError` naming the key path and the file; tyro then applies `--key value` on top, so `--help` documents
every key from the schema's docstrings. `check_batch_arithmetic` rejects batch sizes that cannot be split over the
ranks, before any worker starts. Keys are RLinf's where RLinf has the concept (docs/rlinf_keys.md);
the few of ours are marked "rlinf_mini:".

Files, one role each: schema.py (the sections, in RLinf's YAML order; the env section in schema_embodied.py, data and
reward in schema_reasoning.py), yaml_tree.py (the YAML files into one plain tree, through OmegaConf), load.py (the tree
and the command line into a TrainConfig), checks.py (the values and the batch arithmetic, before any worker starts).
"""

from rlinf_mini.config.checks import (
    check_batch_arithmetic,
    check_precision,
    check_reasoning_batch_arithmetic,
    max_new_tokens,
    validate_config,
    validate_reasoning_config,
)
from rlinf_mini.config.load import (
    config_from_tree,
    config_from_yaml,
    config_source,
    config_to_dict,
    load_config,
    save_config,
    split_overrides,
    unknown_keys,
)
from rlinf_mini.config.schema import (
    PRECISIONS,
    ActorConfig,
    AlgorithmConfig,
    ClusterConfig,
    ConfigError,
    LoggerConfig,
    ModelConfig,
    OptimConfig,
    ProfileDataConfig,
    RolloutConfig,
    RolloutModelConfig,
    RunnerConfig,
    SamplingParams,
    TrainConfig,
)
from rlinf_mini.config.schema_embodied import EnvConfig, EnvSplitConfig, InitParams, VideoConfig
from rlinf_mini.config.schema_reasoning import ArithmeticDataConfig, DataConfig, ReasoningSamplingParams, RewardConfig
from rlinf_mini.config.yaml_tree import RESOLVERS, read_yaml_tree

__all__ = [
    "PRECISIONS", "RESOLVERS", "ActorConfig", "AlgorithmConfig", "ArithmeticDataConfig", "ClusterConfig", "ConfigError",
    "DataConfig", "EnvConfig", "EnvSplitConfig", "InitParams", "LoggerConfig", "ModelConfig", "OptimConfig",
    "ProfileDataConfig",
    "ReasoningSamplingParams", "RewardConfig", "RolloutConfig", "RolloutModelConfig", "RunnerConfig",
    "SamplingParams", "TrainConfig", "VideoConfig", "check_batch_arithmetic", "check_precision",
    "check_reasoning_batch_arithmetic", "config_from_tree", "config_from_yaml", "config_source", "config_to_dict",
    "load_config", "max_new_tokens", "read_yaml_tree", "save_config", "split_overrides",
    "unknown_keys", "validate_config", "validate_reasoning_config",
]
