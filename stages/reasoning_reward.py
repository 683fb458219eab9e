r"""Stage 3'' (reasoning) — reward: named reward functions score each response; their weighted sum is its reward.

    reward:   rank r takes chunks r, r+W, ...: rollout_channel.get -> decode -> score -> reward_channel.put

reward = reward_scale x sum_i reward_weights[i] x REWARD_FUNCS[reward_funcs[i]](response) + overlong_reward(length).
'accuracy' is the verifier's verdict (reward_max_val or reward_min_val); 'format' is 1 when the response states its
answer in a final form (\boxed{}, '####', 'the answer is', or nothing but a number), else 0. The built-in verifier
('rule') extracts the last `\boxed{...}`, else what follows the last "####" or "the answer is", else the last number,
and compares numbers as exact fractions, else normalized strings (any text scores without raising: numbers over
MAX_DIGITS digits compare as strings); 'math_verify' is HF's math-verify (the [math] extra), with a timeout.
Output per chunk: the rollout's result plus rewards [N] (float32).

RLinf counterpart: `rlinf/workers/reward/reward_worker.py::RewardWorker` (`compute_rewards`) and
`rlinf/algorithms/rewards/math/__init__.py::MathReward` (reward_scale, ±1). DAPO's overlong shaping is documented in
RLinf's `reference/algorithms/dapo.rst` (its keys; no code there). Left out: reward models, multiple-choice letters.
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
from stages.math_verify_judge import close_pool, math_verify_equal

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


def is_correct(response: str, references: list[str], verifier: str = "rule") -> bool:
    """The response's answer equals one of the references, by the built-in rule or by math-verify."""
    if verifier == "math_verify":
        return math_verify_equal(response, references)
    answer = extract_answer(response)
    return answer is not None and any(answers_equal(answer, ref) for ref in references)


def math_reward(response: str, references: list[str], max_val: float = 1.0, min_val: float = -1.0,
                verifier: str = "rule") -> float:
    """max_val if the extracted answer equals any reference, else min_val (also when nothing can be extracted)."""
    return max_val if is_correct(response, references, verifier) else min_val


def format_reward(response: str) -> float:
    """1 if the response states its answer in a final form (\boxed{}, '####', 'the answer is', or nothing but one
    number), else 0: it rewards the form, whatever the answer."""
    text = response.strip()
    if last_boxed(text) is not None or "####" in text or "the answer is" in text.lower():
        return 1.0
    return 1.0 if parse_number(text) is not None else 0.0


def accuracy_reward(response: str, references: list[str], reward) -> float:
    """The verifier's verdict: reward.reward_max_val if right, else reward.reward_min_val."""
    return math_reward(response, references, reward.reward_max_val, reward.reward_min_val, reward.verifier)


# reward.reward_funcs names these; each takes (response text, reference answers, the reward config section)
REWARD_FUNCS = {
    "accuracy": accuracy_reward,
    "format": lambda response, references, reward: format_reward(response),
}


def overlong_reward(lengths: torch.Tensor, len_reward_penalty: float, safe_length: int, max_length: int
                    ) -> torch.Tensor:
    """DAPO's overlong reward shaping (arXiv 2503.14476, eq. 13), lengths [N] in response tokens -> [N] in
    [-len_reward_penalty, 0]: 0 up to safe_length, then falling linearly to -len_reward_penalty at max_length, and
    -len_reward_penalty beyond. The paper's L_max is max_length and its L_cache is max_length - safe_length."""
    over = (lengths.float() - safe_length) / (max_length - safe_length)  # [N]
    return -len_reward_penalty * over.clamp(min=0.0, max=1.0)


def score_responses(texts: list[str], references: list[list[str]], lengths: torch.Tensor, reward, algorithm
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """rewards [N] = reward_scale x sum_i w_i f_i(response) + overlong_reward(length), and each term [N] by name
    (f_i unweighted, 'overlong' the shaping term)."""
    weights = reward.reward_weights or [1.0] * len(reward.reward_funcs)
    terms = {name: torch.tensor([REWARD_FUNCS[name](t, refs, reward) for t, refs in
                                 zip(texts, references, strict=True)], dtype=torch.float32)
             for name in reward.reward_funcs}  # [N] each
    rewards = sum(w * terms[name] for name, w in zip(reward.reward_funcs, weights, strict=True)) * reward.reward_scale
    if algorithm.len_reward_penalty > 0:
        terms["overlong"] = overlong_reward(lengths, algorithm.len_reward_penalty, algorithm.safe_length,
                                            algorithm.max_length)
        rewards = rewards + terms["overlong"]
    return rewards, terms


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021's unbiased pass@k from n samples of which c are correct: 1 - C(n - c, k) / C(n, k), the
    chance that k of the n drawn without replacement hold a correct one (as a product, no big binomials)."""
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


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
        """Score the chunks of this rank (c = rank, rank + W, ...) as they arrive; each goes on to the actor.
        Returns sums over its responses: reward/sum, reward/correct, reward/count and reward_sum/<term>."""
        r = self.cfg.reward
        start, sums = time.monotonic(), {"reward/sum": 0.0, "reward/correct": 0.0, "reward/count": 0.0}
        for c in range(self._rank, num_chunks, self._world_size):
            producer = f"{self.cfg.rollout.group_name} rank {c % self.rollout_world_size}"
            result = input_channel.get(key=("rollout", c), expected_from=producer)
            with span("score", stage=c):  # the trace shows it beside the rollout's generate of chunk c + 1
                texts = decode_responses(self.tokenizer, result["response_ids"], result["response_mask"])
                rewards, terms = score_responses(texts, result["answers"], result["response_mask"].sum(dim=-1),
                                                 r, self.cfg.algorithm)
            result["rewards"] = rewards  # [N]
            output_channel.put(result, key=("reward", c))
            correct = (terms["accuracy"] == r.reward_max_val) if "accuracy" in terms else torch.tensor(
                [is_correct(t, refs, r.verifier) for t, refs in zip(texts, result["answers"], strict=True)])
            sums["reward/sum"] += float(rewards.sum())
            sums["reward/correct"] += float(correct.sum())
            sums["reward/count"] += len(texts)
            for name, values in terms.items():
                sums[f"reward_sum/{name}"] = sums.get(f"reward_sum/{name}", 0.0) + float(values.sum())
        return sums | {"time/reward/compute": time.monotonic() - start}

    def close(self) -> None:
        close_pool()  # math-verify's timeout process, when an inline rank (a thread) started one
