"""Reasoning data: a generated arithmetic task written as JSONL (arithmetic.py) and a resumable prompt loader for
any JSONL with RLinf's prompt_key / answer_key (prompt_dataset.py).

RLinf counterpart: `rlinf/data/datasets/reasoning/dataset.py::ReasoningDataset` and the runner's dataloader.
"""
