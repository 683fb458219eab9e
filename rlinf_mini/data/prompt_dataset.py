"""Prompt datasets for reasoning: rows of JSONL / JSON / parquet files -> (prompt token ids, reference answers), and
a resumable loader.

    train = PromptDataset.from_files(cfg.data.train_data_paths, cfg.data, tokenizer)
    loader = PromptLoader(len(train), cfg.data.rollout_batch_size, shuffle=True, seed=cfg.data.seed)
    indices = loader.next_batch()               # [rollout_batch_size] dataset indices
    state = loader.state_dict()                 # {"epoch", "position"}: saved in every checkpoint

The order of epoch e is a permutation drawn from (seed, e) alone, so a resumed loader continues exactly where the
checkpoint left it. A batch never straddles two epochs: the tail of an epoch smaller than a batch is dropped (RLinf's
dataloader uses drop_last too).

Rows: {prompt_key: "text", answer_key: "42" | 42 | ["42", "42.0"] | "... #### 42" | "\\boxed{42}"}, so RLinf's
files ({"prompt", "solutions": [...]}) and GSM8K's ({"question", "answer": "... #### 72"}: prompt_key: question,
answer_key: answer) read as they are; a reference keeps only its final answer (reference_answer).

RLinf counterpart: `rlinf/data/datasets/reasoning/dataset.py::ReasoningDataset` (prompt_key / answer_key, length
filter) and `ReasoningRunner._build_dataloader` (a seeded sampler whose state goes into the checkpoint). Differences:
a prompt over max_prompt_length with filter_prompt_by_length off is an error here (RLinf truncates it, cutting off
the question's end), a row without the keys is an error naming its line (RLinf raises a KeyError at __getitem__).
Left out: chat templates (a prompt must be text), multi-modal prompts, data_size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from rlinf_mini.config import DataConfig
from rlinf_mini.data.rows import read_rows


def last_boxed(text: str) -> str | None:
    r"""The content of the last \boxed{...} (or \fbox{...}), braces balanced; None if there is none or it is open."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[brace + 1 : i]
    return None


def reference_answer(answer: str) -> str:
    r"""A reference as the verifier compares it: what follows the last '####' (GSM8K's solutions end
    '... #### 72'), else the content of the last \boxed{...} (MATH's), else the text itself."""
    if "####" in answer:
        return answer.rsplit("####", 1)[1].strip()
    boxed = last_boxed(answer)
    return answer if boxed is None else boxed.strip()


def _answers(value, where: str, answer_key: str) -> list[str]:
    """A row's accepted answers: a string, a number, or a non-empty list of them (bools and None are refused)."""
    items = value if isinstance(value, list) else [value]
    if not items or any(isinstance(a, bool) or not isinstance(a, str | int | float) for a in items):
        raise ValueError(f"{where}: {answer_key!r} must be a string, a number or a non-empty list of them, got "
                         f"{json.dumps(value, default=str)[:60]}")
    return [reference_answer(str(a)) for a in items]


@dataclass
class PromptDataset:
    prompts: list[str]
    prompt_ids: list[list[int]]  # token ids, no padding; len <= data.max_prompt_length
    answers: list[list[str]]  # accepted reference answers per prompt ('####' / \boxed extracted)
    dropped: list[str] = field(default_factory=list)  # 'file line n' of prompts over max_prompt_length

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def from_files(cls, paths: list[str], data: DataConfig, tokenizer, key: str = "data.train_data_paths"
                   ) -> PromptDataset:
        """Read every row of every file (.jsonl, .json, .parquet: rlinf_mini/data/rows.py); rows whose prompt is
        longer than max_prompt_length tokens of `tokenizer` are dropped (filter_prompt_by_length, listed in
        `dropped`) or are an error naming the file and line. Every error is one line naming `key`, file and line."""
        prompts, ids, answers, dropped = [], [], [], []
        for path in paths:
            for where, row in read_rows(path, key):
                at = f"{key}: {path} {where}"
                for k in (data.prompt_key, data.answer_key):
                    if k not in row:
                        raise ValueError(f"{at}: no key {k!r} (data.prompt_key / data.answer_key; the row has "
                                         f"{sorted(row)[:6]})")
                prompt = row[data.prompt_key]
                if not isinstance(prompt, str) or not prompt:
                    # RLinf's apply_chat_template turns a list of chat messages into text; rlinf_mini has none
                    raise ValueError(f"{at}: {data.prompt_key!r} must be a non-empty string, got "
                                     f"{json.dumps(prompt, default=str)[:60]}")
                refs = _answers(row[data.answer_key], at, data.answer_key)
                tokens = tokenizer(prompt, add_special_tokens=False)["input_ids"]
                if len(tokens) > data.max_prompt_length:
                    if data.filter_prompt_by_length:
                        dropped.append(f"{path} {where}")
                        continue
                    raise ValueError(f"{at}: the prompt has {len(tokens)} tokens, more than "
                                     f"data.max_prompt_length={data.max_prompt_length}")
                prompts.append(prompt)
                ids.append(list(tokens))
                answers.append(refs)
        if not prompts:
            raise ValueError(f"{key}: no prompt of at most data.max_prompt_length={data.max_prompt_length} tokens "
                             f"in {paths} ({len(dropped)} longer, first {dropped[0]})")
        return cls(prompts, ids, answers, dropped)

    def dropped_note(self, key: str, max_prompt_length: int) -> str | None:
        """One line for the console when prompts were dropped, else None."""
        if not self.dropped:
            return None
        return (f"note: {key}: {len(self.dropped)} of {len(self.dropped) + len(self)} prompts are longer than "
                f"data.max_prompt_length={max_prompt_length} tokens and were dropped (first: {self.dropped[0]}); "
                f"data.filter_prompt_by_length=false refuses them instead")


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

    def next_batch(self, n: int | None = None) -> list[int]:
        """The next batch_size indices (or n: dynamic sampling's refills); an epoch's tail too short is skipped."""
        n = self.batch_size if n is None else n
        if self.position + n > self.size:  # drop_last: the next epoch starts
            self.epoch, self.position = self.epoch + 1, 0
        batch = self._order(self.epoch)[self.position : self.position + n]
        self.position += n
        return batch.tolist()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
