"""The reasoning rollout's fast decoding path (`rollout.fast_generation: true`, the default), equal to the plain loop
of stages/reasoning_rollout.py by oracle tests (tests/test_reasoning_generation.py); its speed is
benchmarks/reasoning_generation.py's.

What HF's `generate` does not do makes it faster: a group's G copies of a prompt share one prefill (its cache rows
copied G times, as SGLang / vLLM's prefix cache does), the cache is written in place in a buffer allocated once, a
row that emitted <eos> leaves the batch (later steps compute only the rows still generating), and the output head
runs in cache-sized vocabulary slices on a CPU (last_logits), without autograd. A Llama (SmolLM2) runs a lean
forward over its own weights (rlinf_mini/models/llama_decode.py): the prompts' token trie prefilled once, so
prefixes shared across prompts are computed once.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicLayer

from rlinf_mini.models.generation import left_pad, position_ids_of, sample_tokens
from rlinf_mini.models.llama_decode import LlamaDecoder, is_llama
from rlinf_mini.utils.seeding import counter_uniform


class InPlaceLayer(DynamicLayer):
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


class HFDecoder:
    """LlamaDecoder's interface over the HF model's own forward (any causal LM, e.g. the tiny GPT-2): left-padded
    prompts, one prefill per distinct prompt (unique_rows), the KV cache in place (InPlaceLayer)."""

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
        self.cache = Cache(layers=[InPlaceLayer(capacity) for _ in range(layers)])
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


def fast_generate(model, prompt_ids: list[list[int]], sample_ids: torch.Tensor, sampling,
                  max_new: int, pad_id: int, eos_id: int, seed: int, greedy: bool) -> dict[str, torch.Tensor]:
    """stages/reasoning_rollout.py's `plain_generate`, faster, with the same tokens and log-probs (to 1e-5; tested):
    identical prompts are prefilled once (unique_rows), the KV cache is written in place (InPlaceLayer), a row that
    emitted <eos> leaves the batch (its cache rows are dropped), so later steps compute only the rows still
    generating, and the body runs without its head: logits for the live rows' last positions only, in slices
    (last_logits). A Llama runs LlamaDecoder (prompt-trie prefill, lean forward). Call it in inference mode."""
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
