r"""Stage 3'' (reasoning) — reward: a rule-based math verifier scores each response against its reference answers.

    reward:   rank r takes chunks r, r+W, ...: rollout_channel.get -> decode -> verify -> reward_channel.put

The answer is extracted like RLinf's math verifier: the last `\boxed{...}` (nested braces allowed), else what
follows the last "####" on its line (GSM8K's format; rlinf_mini's addition), else what follows the last "the answer
is", else the last number in the text. Two answers are equal when both parse as
numbers (integers, decimals, `a/b`, `\frac{a}{b}`, `\dfrac`, with sign, `$`, spaces and thousands commas ignored)
and are equal as fractions, or else when their normalized strings are equal. Only ASCII digits count as digits, and
numbers over MAX_DIGITS digits are compared as strings (Python refuses to parse ints over 4300 digits), so any
text scores without raising. Reward per response: reward_max_val if correct else reward_min_val, times reward_scale.
Output per chunk: the rollout's result plus rewards [N] (float32).

RLinf counterpart: `rlinf/workers/reward/reward_worker.py::RewardWorker` (`compute_rewards`) and
`rlinf/algorithms/rewards/math/__init__.py::MathReward` (reward_scale, ±1) with its `math_verifier`. Left out:
symbolic equality (sympy), multiple-choice letters, reward models, the process pool with a timeout.
Next stage: `stages/reasoning_train.py`.
"""

from __future__ import annotations

import re
import time
from fractions import Fraction

import torch

from rlinf_mini.data.prompt_dataset import last_boxed  # the data's reference answers use it too
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.tracer import span
from rlinf_mini.scheduler.worker import Worker

MAX_DIGITS = 200
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?(?:/[0-9]+)?|-?\.[0-9]+")
_FRAC = re.compile(r"^(-?)\\d?frac\{([^{}]*)\}\{([^{}]*)\}$")


def extract_answer(text: str) -> str | None:
    """The response's final answer: last boxed, else after the last '####', else after the last 'the answer is',
    else the last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    if "####" in text:  # GSM8K's final-answer line: '... #### 72'
        tail = text.rsplit("####", 1)[1].strip().split("\n", 1)[0].strip()
        if tail:
            return tail
    lower = text.lower()
    at = lower.rfind("the answer is")
    if at >= 0:
        tail = text[at + len("the answer is"):].strip().lstrip(":").strip()
        tail = re.split(r"\n|\.(?:\s|$)", tail, maxsplit=1)[0].strip()
        if tail:
            return tail
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def parse_number(text: str) -> Fraction | None:
    """A number or simple fraction as an exact Fraction, or None ('1,234' -> 1234, '\\frac{1}{2}' -> 1/2)."""
    s = text.strip().strip("$").replace(" ", "").rstrip(".")
    frac = _FRAC.match(s)
    if frac:
        num, den = parse_number(frac[2]), parse_number(frac[3])
        if num is None or den is None or den == 0:
            return None
        return -num / den if frac[1] else num / den
    if re.fullmatch(r"-?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]+)?", s):
        s = s.replace(",", "")
    if not re.fullmatch(r"-?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:/[0-9]+)?", s):
        return None
    if sum(ch.isdigit() for ch in s) > MAX_DIGITS:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _normalize(s: str) -> str:
    return s.strip().strip("$").replace(" ", "").rstrip(".").lower()


def answers_equal(prediction: str, reference: str) -> bool:
    """Equal as numbers when both parse, else as normalized strings."""
    a, b = parse_number(prediction), parse_number(reference)
    if a is not None and b is not None:
        return a == b
    return bool(_normalize(prediction)) and _normalize(prediction) == _normalize(reference)


def math_reward(response: str, references: list[str], max_val: float = 1.0, min_val: float = -1.0) -> float:
    """max_val if the extracted answer equals any reference, else min_val (also when nothing can be extracted)."""
    answer = extract_answer(response)
    if answer is None:
        return min_val
    return max_val if any(answers_equal(answer, ref) for ref in references) else min_val


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """The text of each response [N, R], without <eos> and padding."""
    eos = tokenizer.eos_token_id
    return [tokenizer.decode([t for t, m in zip(ids.tolist(), mask.tolist(), strict=True) if m and t != eos])
            for ids, mask in zip(response_ids, response_mask, strict=True)]


class ReasoningRewardWorker(Worker):
    def init_worker(self, rollout_world_size: int) -> None:
        from rlinf_mini.models.tiny_lm import load_tokenizer

        self.tokenizer = load_tokenizer(self.cfg.actor.model.model_path)
        self.rollout_world_size = rollout_world_size

    def compute_rewards(self, input_channel: Channel, output_channel: Channel, num_chunks: int) -> dict[str, float]:
        """Score the chunks of this rank (c = rank, rank + W, ...) as they arrive; each goes on to the actor."""
        r = self.cfg.reward
        start, total, correct, n = time.monotonic(), 0.0, 0.0, 0
        for c in range(self._rank, num_chunks, self._world_size):
            producer = f"{self.cfg.rollout.group_name} rank {c % self.rollout_world_size}"
            result = input_channel.get(key=("rollout", c), expected_from=producer)
            with span("score", stage=c):  # the trace shows it beside the rollout's generate of chunk c + 1
                texts = decode_responses(self.tokenizer, result["response_ids"], result["response_mask"])
                scores = [math_reward(t, refs, r.reward_max_val, r.reward_min_val) for t, refs in
                          zip(texts, result["answers"], strict=True)]
            result["rewards"] = torch.tensor(scores, dtype=torch.float32) * r.reward_scale  # [N]
            output_channel.put(result, key=("reward", c))
            total += sum(scores) * r.reward_scale
            correct += sum(s == r.reward_max_val for s in scores)
            n += len(scores)
        return {"reward/sum": total, "reward/correct": correct, "reward/count": float(n),
                "time/reward/compute": time.monotonic() - start}

