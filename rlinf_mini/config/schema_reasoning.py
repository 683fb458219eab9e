"""The reasoning sections of the schema (runner.task_type: reasoning): data, reward, algorithm.sampling_params."""

# (No `from __future__ import annotations` here: tyro reads these annotations at every parse with flags, and string
# annotations would be compiled again at each one; docs/performance.md has the cost.)

from dataclasses import dataclass, field
from typing import Literal

REWARD_FUNC_NAMES = ("accuracy", "format")  # stages/reasoning_reward.py REWARD_FUNCS, in this order (a test checks)


@dataclass
class ReasoningSamplingParams:
    do_sample: bool = True
    """Sample (True) or take the argmax (False) for training responses; evaluation is always greedy."""
    temperature: float = 1.0
    """Logits are divided by this before sampling; the log-probs are those of softmax(logits / temperature)."""
    top_k: int = -1
    """Sample among the k most likely tokens only (<= 0: all)."""
    top_p: float = 1.0
    """Sample among the most likely tokens whose probabilities sum to top_p (nucleus); 1.0 = all."""
    max_new_tokens: int = -1
    """Response tokens at most; -1 = runner.seq_length - data.max_prompt_length."""


@dataclass
class ArithmeticDataConfig:
    num_train: int = 4096
    """rlinf_mini: problems written to the train file."""
    num_val: int = 256
    """rlinf_mini: held-out problems written to the val file (none of them is in the train file)."""
    max_operand: int = 99
    """rlinf_mini: operands are drawn from 0..max_operand."""
    seed: int = 0
    """rlinf_mini: seed of the generated problems."""
    few_shot: int = 0
    """rlinf_mini: start each prompt with this many solved problems, one per line (for pretrained models)."""
    zero_pad: bool = False
    """rlinf_mini: zero-pad operands and the sum ('07+45=' -> '052'): each digit keeps its place."""


@dataclass
class DataConfig:
    type: Literal["math"] = "math"
    """Reasoning data: prompts with reference answers, scored by the math verifier."""
    dataset_name: str = ""
    """'arithmetic': the entry writes train_data_paths[0] / val_data_paths[0] when missing (rlinf_mini/data)."""
    train_data_paths: list[str] = field(default_factory=list)
    """Training prompt files (.jsonl, .json, .parquet), rows with prompt_key and answer_key."""
    val_data_paths: list[str] = field(default_factory=list)
    """Held-out prompt files, as train_data_paths (greedy exact match, logged as eval/accuracy)."""
    prompt_key: str = "prompt"
    """The key of the prompt text (GSM8K's: 'question'); a prompt must be a string (no chat template)."""
    answer_key: str = "solutions"
    """The key of the reference answer: a string, a number or a list of accepted ones."""
    max_prompt_length: int = 16
    """Prompt tokens at most, in the model's tokenizer (prompts are left-padded to the longest of their batch)."""
    filter_prompt_by_length: bool = True
    """Drop prompts over max_prompt_length, else an error (RLinf's default false: truncated)."""
    rollout_batch_size: int = 16
    """Prompts per training step; each gets algorithm.group_size responses."""
    shuffle: bool = True
    """Visit the train prompts in a new order each epoch (a function of seed and epoch)."""
    seed: int = 1234
    """Seed of the shuffle."""
    arithmetic: ArithmeticDataConfig = field(default_factory=ArithmeticDataConfig)
    """rlinf_mini: the generated arithmetic task (dataset_name 'arithmetic')."""


@dataclass
class RewardConfig:
    group_name: str = "RewardGroup"
    """Worker group name."""
    use_reward_model: bool = False
    """Only rule-based rewards exist here (false)."""
    reward_type: Literal["math"] = "math"
    """'math': the rule-based math verifier (stages/reasoning_reward.py)."""
    reward_scale: float = 1.0
    """Rewards are reward_max_val or reward_min_val, times this."""
    reward_max_val: float = 1.0
    """Reward of a correct answer (before reward_scale)."""
    reward_min_val: float = -1.0
    """Reward of a wrong or missing answer (before reward_scale)."""
    reward_funcs: list[str] = field(default_factory=lambda: ["accuracy"])
    """Reasoning (TRL's name): the built-in rewards summed: 'accuracy', 'format'."""
    reward_weights: list[float] = field(default_factory=list)
    """Reasoning (TRL's name): the weight of each of reward_funcs; empty = all 1."""
    verifier: Literal["rule", "math_verify"] = "rule"
    """How 'accuracy' judges an answer: 'rule' (built-in) or 'math_verify' (HF's, the [math] extra)."""
    permute_rewards: bool = False
    """rlinf_mini: a control: shuffle the rewards within each batch (they carry no information)."""


