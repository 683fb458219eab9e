"""Prompt datasets for reasoning: JSONL rows -> (prompt token ids, reference answers), and a resumable loader.

    train = PromptDataset.from_jsonl(cfg.data.train_data_paths, cfg.data, tokenizer)
    loader = PromptLoader(len(train), cfg.data.rollout_batch_size, shuffle=True, seed=cfg.data.seed)
    indices = loader.next_batch()               # [rollout_batch_size] dataset indices
    state = loader.state_dict()                 # {"epoch", "position"}: saved in every checkpoint

The order of epoch e is a permutation drawn from (seed, e) alone, so a resumed loader continues exactly where the
checkpoint left it. A batch never straddles two epochs: the tail of an epoch smaller than a batch is dropped (RLinf's
dataloader uses drop_last too).

RLinf counterpart: `rlinf/data/datasets/reasoning/dataset.py::ReasoningDataset` (prompt_key / answer_key, length
filter) and `ReasoningRunner._build_dataloader` (a seeded sampler whose state goes into the checkpoint). Left out:
chat templates, multi-modal prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from rlinf_mini.config import DataConfig


@dataclass
class PromptDataset:
    prompts: list[str]
    prompt_ids: list[list[int]]  # token ids, no padding; len <= data.max_prompt_length
    answers: list[list[str]]  # accepted reference answers per prompt

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def from_jsonl(cls, paths: list[str], data: DataConfig, tokenizer, key: str = "data.train_data_paths"
                   ) -> PromptDataset:
        """Read every row of every file; rows whose prompt is longer than max_prompt_length tokens are dropped
        (filter_prompt_by_length) or are an error naming the file and line."""
        prompts, ids, answers = [], [], []
        for path in paths:
            for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    prompt, answer = row[data.prompt_key], row[data.answer_key]
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"{key}: {path} line {n}: needs a JSON object with keys {data.prompt_key!r} "
                                     f"and {data.answer_key!r} ({type(e).__name__}: {e})") from None
                tokens = tokenizer(str(prompt), add_special_tokens=False)["input_ids"]
                if len(tokens) > data.max_prompt_length:
                    if data.filter_prompt_by_length:
                        continue
                    raise ValueError(f"{key}: {path} line {n}: the prompt has {len(tokens)} tokens, more than "
                                     f"data.max_prompt_length={data.max_prompt_length}")
                prompts.append(str(prompt))
                ids.append(list(tokens))
                answers.append([str(a) for a in answer] if isinstance(answer, list) else [str(answer)])
        if not prompts:
            raise ValueError(f"{key}: no prompt of at most data.max_prompt_length={data.max_prompt_length} tokens "
                             f"in {paths}")
        return cls(prompts, ids, answers)


class PromptLoader:
    """Batches of dataset indices, epoch after epoch; its whole state is (epoch, position)."""

    def __init__(self, size: int, batch_size: int, shuffle: bool, seed: int):
        if batch_size > size:
            raise ValueError(f"data.rollout_batch_size: {batch_size} exceeds the {size} train prompts")
        self.size, self.batch_size, self.shuffle, self.seed = size, batch_size, shuffle, seed
        self.epoch, self.position = 0, 0

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.size)
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))

    def next_batch(self) -> list[int]:
        if self.position + self.batch_size > self.size:  # drop_last: the next epoch starts
            self.epoch, self.position = self.epoch + 1, 0
        batch = self._order(self.epoch)[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch.tolist()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
