"""Stage 3' (reasoning) — rollout: prompts -> `group_size` sampled responses each, with the HF model's KV cache.

    runner:   dataloader_channel.put({"prompt_ids", "answers", "first_sample_id"}, key=chunk)      per chunk
    rollout:  rank r takes chunks r, r+W, ...: generate -> rollout_channel.put(result, key=chunk)   (to the reward)

A chunk is `algorithm.rollout_batch_size_per_gpu` prompts, each repeated `group_size` times (a group's responses are
consecutive). Prompts are left-padded to the chunk's longest (pad tokens get attention_mask 0 and the position ids
restart at 0 on the first real token), then one forward pass fills the KV cache and each new token costs one step
(`plain_generate`, below: the loop to read). `rollout.fast_generation` (on by default) runs the same tokens faster
(rlinf_mini/models/fast_generation.py: one prefill per distinct prompt, the cache written in place, finished rows
leaving the batch, SmolLM2's lean forward), equal to this loop by oracle tests.
Result per chunk (N = prompts x G responses): prompt_ids [N, P] (left-padded), prompt_mask [N, P], response_ids
[N, R] (right-padded after <eos>), response_mask [N, R] (1 up to and including <eos>), logprobs [N, R] under
softmax(logits / temperature), version, answers, first_sample_id.

Randomness: token t of response n is drawn by inverse CDF from `counter_uniform(seed, n's global sample id, t)`, and
chunks are cut the same way whatever the number of ranks, so 1 or 2 rollout ranks give identical responses.

RLinf counterpart: `rlinf/workers/rollout/sglang/` and `vllm/` workers (`rollout`, `sync_model_from_actor`),
`ReasoningRunner._put_batch`. Left out: continuous batching, repetition_penalty, min_new_tokens, chat templates.
Next stage: `stages/reasoning_reward.py`.
"""

from __future__ import annotations

import inspect
import time

import torch
from transformers.cache_utils import DynamicCache

from rlinf_mini.config import ReasoningSamplingParams, max_new_tokens
from rlinf_mini.models.fast_generation import fast_generate
from rlinf_mini.models.generation import left_pad, position_ids_of, sample_tokens
from rlinf_mini.models.tiny_lm import load_causal_lm
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.tracer import span
from rlinf_mini.scheduler.worker import Worker
from rlinf_mini.utils.precision import autocast
from rlinf_mini.utils.seeding import counter_uniform
from stages.reasoning_reward import decode_responses, is_correct, math_reward
from stages.sync import WeightBufferHandle, WeightReceiver

EVAL_SAMPLE_IDS = 1 << 50  # eval's sampled responses draw their noise from streams training never reaches


def plain_generate(model, prompt_ids: list[list[int]], sample_ids: torch.Tensor, sampling: ReasoningSamplingParams,
                   max_new: int, pad_id: int, eos_id: int, seed: int, greedy: bool) -> dict[str, torch.Tensor]:
    """The loop of the module docstring, over HF's own forward and KV cache: every row stays in the batch to the
    end; a row past its <eos> gets pad tokens, log-prob 0 and mask 0. Call it in inference mode."""
    device = next(model.parameters()).device
    input_ids, prompt_mask = (t.to(device) for t in left_pad(prompt_ids, pad_id))  # [N, P]
    n = len(prompt_ids)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # HF 5 / 4
    cache = DynamicCache()
    mask = prompt_mask
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids_of(mask), use_cache=True,
                **{cache_kw: cache})
    logits = out.logits[:, -1]  # [N, V]: the next token's, after each prompt's last real token
    next_pos = position_ids_of(mask)[:, -1] + 1  # [N]
    tokens = torch.full((n, max_new), pad_id, dtype=torch.long, device=device)  # [N, R]
    logprobs = torch.zeros((n, max_new), dtype=torch.float32, device=device)
    masks = torch.zeros((n, max_new), dtype=torch.bool, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)  # [N]: emitted <eos> already
    steps = 0
    for t in range(max_new):
        steps = t + 1
        scaled = logits.float() / sampling.temperature  # [N, V]
        if greedy or not sampling.do_sample:
            token = scaled.argmax(dim=-1)
        else:  # response n's token t: its own noise stream, whatever the batch (counter_uniform)
            u = counter_uniform(seed, sample_ids, t, 1)[:, 0].to(device)  # [N]
            token = sample_tokens(scaled, u, sampling.top_k, sampling.top_p)
        token = torch.where(done, pad_id, token)
        logprob = torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)
        tokens[:, t], logprobs[:, t], masks[:, t] = token, torch.where(done, 0.0, logprob), ~done
        done |= token == eos_id
        if bool(done.all()) or t + 1 == max_new:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # [N, P+t+1]
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=next_pos[:, None], use_cache=True,
                    **{cache_kw: cache})
        logits, next_pos = out.logits[:, -1], next_pos + 1
    return {"prompt_ids": input_ids, "prompt_mask": prompt_mask, "response_ids": tokens[:, :steps],
            "response_mask": masks[:, :steps].long(), "logprobs": logprobs[:, :steps]}


def generate(model, prompt_ids: list[list[int]], sample_ids: torch.Tensor, sampling: ReasoningSamplingParams,
             max_new: int, pad_id: int, eos_id: int, seed: int, greedy: bool = False,
             fast: bool = True) -> dict[str, torch.Tensor]:
    """Sample one response per prompt (repeat prompts for groups). sample_ids [N]: each response's global id, the
    stream of its noise. Stops at <eos> or after max_new tokens; returns the tensors of the module docstring.
    `fast` (rollout.fast_generation): fast_generate, else plain_generate; the same tokens and log-probs."""
    run = fast_generate if fast else plain_generate
    with torch.inference_mode():  # no autograd bookkeeping per op; the results are cloned out of inference mode
        out = run(model, prompt_ids, sample_ids, sampling, max_new, pad_id, eos_id, seed, greedy)
    return {k: v.cpu().clone() for k, v in out.items()}


class ReasoningRolloutWorker(Worker):
    def init_worker(self) -> WeightBufferHandle:
        """Load the model (rollout.model.model_path, else the actor's) and its weight buffer; returns the handle."""
        path = self.cfg.rollout.model.model_path or self.cfg.actor.model.model_path
        self.model, self.tokenizer = load_causal_lm(path)
        self.model.to(self.device)
        self.receiver = WeightReceiver(self.model)
        return self.receiver.handle()

    def sync_model_from_actor(self, version: int) -> float:
        return self.receiver.wait_for_version(version, timeout=self.cfg.cluster.timeout_s)

    def _generate(self, prompt_ids: list[list[int]], sample_ids: torch.Tensor, greedy: bool) -> dict:
        with autocast(self.cfg.rollout.model.precision, self.device):  # bf16 on a GPU when asked
            return generate(self.model, prompt_ids, sample_ids, self.cfg.algorithm.sampling_params,
                            max_new_tokens(self.cfg), self.tokenizer.pad_token_id, self.tokenizer.eos_token_id,
                            self.cfg.actor.seed, greedy=greedy, fast=self.cfg.rollout.fast_generation)

    def rollout(self, input_channel: Channel, output_channel: Channel, num_chunks: int) -> dict[str, float]:
        """Generate the chunks of this rank (c = rank, rank + W, ...), one result per chunk to the reward."""
        if self.receiver.version < 0:
            raise RuntimeError("rollout has no weights yet: call sync_model_from_actor first")
        group = self.cfg.algorithm.group_size
        start, n_tokens, n_responses = time.monotonic(), 0, 0
        for c in range(self._rank, num_chunks, self._world_size):
            msg = input_channel.get(key=("prompts", c), expected_from="the driver (ReasoningRunner)")
            prompts = [p for p in msg["prompt_ids"] for _ in range(group)]  # each prompt G times, consecutive
            sample_ids = msg["first_sample_id"] + torch.arange(len(prompts))
            with span("generate", stage=c):  # the trace: the reward scores chunk c - 1 meanwhile
                result = self._generate(prompts, sample_ids, greedy=False)
            result |= {"answers": [a for a in msg["answers"] for _ in range(group)], "chunk": c,
                       "version": self.receiver.version}
            output_channel.put(result, key=("rollout", c))
            n_tokens += int(result["response_mask"].sum())
            n_responses += len(prompts)
        seconds = time.monotonic() - start
        return {"rollout/tokens": float(n_tokens), "rollout/responses": float(n_responses),
                "time/rollout/generate": seconds}

    def evaluate(self, prompt_ids: list[list[int]], answers: list[list[str]], chunk_size: int) -> list[float]:
        """Greedy responses to this rank's share (i % W == rank) of the prompts, scored 1/0 by the math verifier;
        returns [(index, correct)] flattened as floats."""
        out = []
        mine = list(range(self._rank, len(prompt_ids), self._world_size))
        for s in range(0, len(mine), chunk_size):
            idx = mine[s:s + chunk_size]
            result = self._generate([prompt_ids[i] for i in idx], torch.tensor(idx), greedy=True)
            texts = decode_responses(self.tokenizer, result["response_ids"], result["response_mask"])
            for i, text in zip(idx, texts, strict=True):
                out += [float(i), float(math_reward(text, answers[i], 1.0, 0.0, self.cfg.reward.verifier))]
        return out

    def evaluate_samples(self, prompt_ids: list[list[int]], answers: list[list[str]], chunk_size: int,
                         num_samples: int) -> list[float]:
        """num_samples sampled responses (the training sampling params) to each of this rank's prompts (i % W ==
        rank), scored by the verifier; returns [(index, correct count)] flattened as floats. The noise of sample j
        of prompt i is stream EVAL_SAMPLE_IDS + i * num_samples + j: the same at every eval, apart from training's."""
        out = []
        mine = list(range(self._rank, len(prompt_ids), self._world_size))
        per_call = max(1, chunk_size // num_samples)  # prompts per generate call
        for s in range(0, len(mine), per_call):
            idx = mine[s:s + per_call]
            prompts = [prompt_ids[i] for i in idx for _ in range(num_samples)]  # each prompt n times, consecutive
            ids = torch.tensor([EVAL_SAMPLE_IDS + i * num_samples + j for i in idx for j in range(num_samples)])
            result = self._generate(prompts, ids, greedy=False)
            texts = decode_responses(self.tokenizer, result["response_ids"], result["response_mask"])
            for k, i in enumerate(idx):
                correct = sum(is_correct(t, answers[i], self.cfg.reward.verifier)
                              for t in texts[k * num_samples:(k + 1) * num_samples])
                out += [float(i), float(correct)]
        return out

    def close(self) -> None:
        if hasattr(self, "receiver"):
            self.receiver.close()

