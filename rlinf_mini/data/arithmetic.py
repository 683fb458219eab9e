"""The default reasoning task: two-operand addition, written as JSONL with RLinf's keys.

    write_arithmetic_jsonl(cfg.data, train_path, val_path)     # {"prompt": "37+45=", "solutions": ["82"]} per line

Train and held-out problems are disjoint, a + b and b + a counting as one problem (a held-out 37+45 has no 45+37 in
the train file either), drawn from `data.arithmetic.seed`.
The entry writes the files when `data.dataset_name: arithmetic` and they are missing; any other JSONL with the
configured prompt_key / answer_key works the same.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from rlinf_mini.config import DataConfig


def arithmetic_problems(max_operand: int, n: int, seed: int) -> list[tuple[int, int]]:
    """`n` distinct operand pairs (a, b) from 0..max_operand, in a seeded random order."""
    space = (max_operand + 1) ** 2
    if n > space:
        raise ValueError(f"data.arithmetic: {n} problems asked, but only {space} distinct pairs exist")
    picks = random.Random(seed).sample(range(space), n)
    return [(p // (max_operand + 1), p % (max_operand + 1)) for p in picks]


def format_problem(a: int, b: int, shots: list[tuple[int, int]] = (), digits: int = 0) -> tuple[str, str]:
    """The prompt the model completes and its reference answer: ('37+45=', '82'); with `shots`, solved problems
    come first, one per line ('12+35=47\n37+45='); with `digits` > 0, operands are zero-padded to that many digits
    and the sum to one more ('07+45=', '052'): every digit of a place sits at the same position in every problem."""
    def num(n: int, width: int) -> str:
        return f"{n:0{width}d}" if digits else str(n)

    def solved(x: int, y: int) -> str:
        return f"{num(x, digits)}+{num(y, digits)}="

    prefix = "".join(f"{solved(x, y)}{num(x + y, digits + 1)}\n" for x, y in shots)
    return f"{prefix}{solved(a, b)}", num(a + b, digits + 1)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one


def write_arithmetic_jsonl(data: DataConfig, train_path: str | Path, val_path: str | Path) -> None:
    """Write num_train train and num_val held-out problems (disjoint) with data.prompt_key / data.answer_key."""
    a = data.arithmetic
    total = a.num_train + a.num_val + a.few_shot
    # each held-out pair bars at most one other (its swap): twice the pairs asked for always suffice
    space = (a.max_operand + 1) ** 2
    drawn = arithmetic_problems(a.max_operand, min(space, 2 * total), a.seed)
    held_out = drawn[: a.num_val]
    barred = {(min(x, y), max(x, y)) for x, y in held_out}
    rest = [(x, y) for x, y in drawn[a.num_val:] if (min(x, y), max(x, y)) not in barred]
    if len(rest) < a.num_train + a.few_shot:
        raise ValueError(f"data.arithmetic: {a.num_train} train + {a.few_shot} shots + {a.num_val} held-out problems "
                         f"do not fit in the {space} pairs of 0..{a.max_operand} with a + b and b + a on one side")
    train, shots = rest[: a.num_train], rest[a.num_train: a.num_train + a.few_shot]  # shots: in every prompt
    digits = len(str(a.max_operand)) if a.zero_pad else 0
    for path, pairs in ((val_path, held_out), (train_path, train)):
        rows = []
        for x, y in pairs:
            prompt, answer = format_problem(x, y, shots, digits)
            rows.append({data.prompt_key: prompt, data.answer_key: [answer]})
        _write_jsonl(Path(path), rows)
