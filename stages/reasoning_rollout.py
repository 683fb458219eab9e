"""Stage 3' (reasoning) — rollout: prompts -> `group_size` sampled responses each, with the HF model's KV cache.

    runner:   dataloader_channel.put({"prompt_ids", "answers", "first_sample_id"}, key=chunk)      per chunk
    rollout:  rank r takes chunks r, r+W, ...: generate -> rollout_channel.put(result, key=chunk)   (to the reward)

A chunk is `algorithm.rollout_batch_size_per_gpu` prompts, each repeated `group_size` times (a group's responses are
consecutive). Prompts are left-padded to the chunk's longest (pad tokens get attention_mask 0 and the position ids
restart at 0 on the first real token), then one forward pass fills the KV cache and each new token costs one step.
What HF `generate` does not do makes it faster (benchmarks/reasoning_generation.py): a group's G copies of a prompt
share one prefill (its cache rows copied G times, as SGLang / vLLM's prefix cache does), the cache is written in place
in a buffer allocated once, a row that emitted <eos> leaves the batch (later steps compute only the rows still
generating), and the output head runs in cache-sized vocabulary slices on a CPU (last_logits), without autograd.
A Llama (SmolLM2) runs a lean forward over its own weights (rlinf_mini/models/llama_decode.py): the prompts' token
trie prefilled once, so prefixes shared across prompts are computed once, and no per-layer Python of HF's per token.
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
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicLayer

from rlinf_mini.config import ReasoningSamplingParams, max_new_tokens
from rlinf_mini.models.llama_decode import LlamaDecoder, is_llama
from rlinf_mini.models.tiny_lm import load_causal_lm
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.tracer import span
from rlinf_mini.scheduler.worker import Worker
from rlinf_mini.utils.precision import autocast
from rlinf_mini.utils.seeding import counter_uniform
from stages.reasoning_reward import decode_responses, is_correct, math_reward
from stages.sync import WeightBufferHandle, WeightReceiver

EVAL_SAMPLE_IDS = 1 << 50  # eval's sampled responses draw their noise from streams training never reaches


def left_pad(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (input_ids [N, P], attention_mask [N, P]), padded on the left to the longest."""
    width = max(map(len, prompt_ids))
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        if p:
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
    return ids, mask


def position_ids_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """[N, L]: 0, 1, 2, ... over the real tokens; pads (left or right) repeat a neighbour's value and are masked."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)


def sample_tokens(logits: torch.Tensor, u: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Inverse-CDF sampling: logits [N, V] (already divided by the temperature), u [N] in (0, 1) -> tokens [N].
    top_k / top_p keep the k most likely tokens / the smallest set whose probability reaches top_p (renormalized)."""
    probs = torch.softmax(logits.float(), dim=-1)  # [N, V]
    if top_k <= 0 and top_p >= 1.0:
        cdf = probs.cumsum(dim=-1)  # [N, V] in vocab order: no sort needed
        return torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # [N, V]
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if top_k > 0:
        keep[:, top_k:] = False
    if top_p < 1.0:  # drop a token when the tokens before it already reach top_p (the first always stays)
        keep &= (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p
    cdf = (sorted_probs * keep).cumsum(dim=-1)  # [N, V]
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).clamp(max=probs.shape[-1] - 1)  # [N, 1]
    return order.gather(-1, pick).squeeze(-1)


class _InPlaceLayer(DynamicLayer):
    """A KV-cache layer whose keys/values live in a buffer allocated once for `capacity` positions: a decode step
    writes its one slot, where HF's DynamicLayer concatenates the whole cache of every layer anew each step (a copy
    of the whole cache per token). keys / values are views [B, H, length, D]."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            b, h, _, d = key_states.shape
            self._k = key_states.new_empty(b, h, self.capacity, d)  # [B, H, capacity, D]
            self._v = value_states.new_empty(b, value_states.shape[1], self.capacity, value_states.shape[-1])
            self.device, self.is_initialized = key_states.device, True
        end = self.length + key_states.shape[-2]
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Rows `indices` of the cache (repeats allowed: a shared prompt's rows become its group's)."""
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, :self.length], self._v[:, :, :self.length]


def last_logits(model, hidden: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """hidden [A, H] (each live row's last position, after the final norm) -> logits [A, V] by the model's output
    head, `chunk` vocabulary rows at a time on a CPU. Why: with a big vocabulary (SmolLM2: 49152 x 576, 113 MB) and
    a few rows, one MKL GEMM repacks the whole weight through memory every token; 512-row slices pack in cache
    (docs/performance.md has both times). Each logit is the same dot product (bitwise here; the tests
    check it against the plain head)."""
    head = model.get_output_embeddings()  # nn.Linear [V, H]: the causal LMs here (GPT-2, Llama) compute head(hidden)
    if hidden.device.type != "cpu" or head.weight.shape[0] <= chunk:
        return head(hidden)
    w, b = head.weight, head.bias
    return torch.cat([F.linear(hidden, w[i:i + chunk], None if b is None else b[i:i + chunk])
                      for i in range(0, w.shape[0], chunk)], dim=-1)


def unique_rows(prompt_ids: list[list[int]]) -> tuple[list[int], torch.Tensor]:
    """(the first row of each distinct prompt, [N]: each row's index among those): a group's G copies of a prompt
    are prefilled once and their cache rows copied, as SGLang / vLLM's prefix caching does."""
    first: dict[tuple[int, ...], int] = {}
    inverse = [first.setdefault(tuple(p), len(first)) for p in prompt_ids]
    rows = [0] * len(first)
    for i, u in reversed(list(enumerate(inverse))):
        rows[u] = i
    return rows, torch.tensor(inverse)


def generate(model, prompt_ids: list[list[int]], sample_ids: torch.Tensor, sampling: ReasoningSamplingParams,
             max_new: int, pad_id: int, eos_id: int, seed: int, greedy: bool = False) -> dict[str, torch.Tensor]:
    """Sample one response per prompt (repeat prompts for groups). sample_ids [N]: each response's global id, the
    stream of its noise. Stops at <eos> or after max_new tokens; returns the tensors of the module docstring.

    Where it differs from HF `generate` for speed: identical prompts are prefilled once (unique_rows), the KV cache
    is written in place (_InPlaceLayer), a row that emitted <eos> leaves the batch (its cache rows are dropped), so
    later steps compute only the rows still generating, and the body runs without its head: logits are computed
    for the live rows' last positions only, in slices (last_logits)."""
    with torch.inference_mode():  # no autograd bookkeeping per op; the results are cloned out of inference mode
        out = _generate(model, prompt_ids, sample_ids, sampling, max_new, pad_id, eos_id, seed, greedy)
    return {k: v.cpu().clone() for k, v in out.items()}


class HFDecoder:
    """LlamaDecoder's interface over the HF model's own forward (any causal LM, e.g. the tiny GPT-2): left-padded
    prompts, one prefill per distinct prompt (unique_rows), the KV cache in place (_InPlaceLayer)."""

    def __init__(self, model, prompt_ids: list[list[int]], capacity: int, pad_id: int):
        device = next(model.parameters()).device
        input_ids, self.mask = (t.to(device) for t in left_pad(prompt_ids, pad_id))  # [N, P]
        positions = position_ids_of(self.mask)  # [N, P]
        firsts, inverse = unique_rows(prompt_ids)  # [U], [N]
        self.inverse = inverse.to(device)
        # transformers 5 names the KV cache `cache`; 4.x named it `past_key_values`
        params = inspect.signature(model.base_model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        layers = model.config.get_text_config().num_hidden_layers
        self.cache = Cache(layers=[_InPlaceLayer(capacity) for _ in range(layers)])
        self.body = model.base_model  # the transformer without its output head: logits only where a token is drawn
        out = self.body(input_ids=input_ids[firsts], attention_mask=self.mask[firsts], position_ids=positions[firsts],
                        use_cache=True, **{self.cache_kw: self.cache})
        self.last_hidden = out.last_hidden_state[:, -1]  # [U, H]; row n's is last_hidden[inverse[n]]
        if len(firsts) < len(prompt_ids):
            self.cache.batch_select_indices(self.inverse)  # [U, ...] -> [N, ...]
        self.next_pos = positions[:, -1] + 1  # [N]

    def keep(self, rows: torch.Tensor) -> None:
        self.mask, self.next_pos = self.mask[rows], self.next_pos[rows]
        self.cache.batch_select_indices(rows)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [A] -> hidden [A, H] (after the final norm)."""
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)  # [A, P+t+1]
        out = self.body(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=self.next_pos[:, None],
                        use_cache=True, **{self.cache_kw: self.cache})
        self.next_pos = self.next_pos + 1
        return out.last_hidden_state[:, -1]


def _generate(model, prompt_ids: list[list[int]], sample_ids: torch.Tensor, sampling: ReasoningSamplingParams,
              max_new: int, pad_id: int, eos_id: int, seed: int, greedy: bool) -> dict[str, torch.Tensor]:
    device = next(model.parameters()).device
    input_ids, prompt_mask = (t.to(device) for t in left_pad(prompt_ids, pad_id))  # [N, P]
    n, width = input_ids.shape
    if is_llama(model) and all(prompt_ids):  # SmolLM2: the lean forward, prefix-shared prefill (llama_decode.py)
        body = LlamaDecoder(model, prompt_ids, width + max_new)
    else:
        body = HFDecoder(model, prompt_ids, width + max_new, pad_id)
    logits = last_logits(model, body.last_hidden)[body.inverse]  # [N, V]: the head once per distinct prompt
    rows = torch.arange(n, device=device)  # the rows still generating -> their index in the output
    tokens = torch.full((n, max_new), pad_id, dtype=torch.long, device=device)  # [N, R]
    logprobs = torch.zeros((n, max_new), dtype=torch.float32, device=device)
    masks = torch.zeros((n, max_new), dtype=torch.bool, device=device)
    steps = 0
    for t in range(max_new):
        steps = t + 1
        scaled = logits.float() / sampling.temperature  # [A, V], A = rows still generating
        if greedy or not sampling.do_sample:
            token = scaled.argmax(dim=-1)
        else:
            u = counter_uniform(seed, sample_ids[rows.cpu()], t, 1)[:, 0].to(device)  # [A]
            token = sample_tokens(scaled, u, sampling.top_k, sampling.top_p)
        tokens[rows, t] = token
        logprobs[rows, t] = torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)
        masks[rows, t] = True
        if t + 1 == max_new:
            break
        going = token != eos_id  # [A]
        if not bool(going.all()):
            if not bool(going.any()):
                break
            keep = going.nonzero().squeeze(-1)  # the rows that finished leave the batch and the cache
            rows, token = rows[keep], token[keep]
            body.keep(keep)
        logits = last_logits(model, body.step(token))
    return {"prompt_ids": input_ids, "prompt_mask": prompt_mask, "response_ids": tokens[:, :steps],
            "response_mask": masks[:, :steps].long(), "logprobs": logprobs[:, :steps]}


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
                            self.cfg.actor.seed, greedy=greedy)

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

