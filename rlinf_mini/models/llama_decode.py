"""A lean forward for Llama-family causal LMs (SmolLM2) over the HF model's own weights, for the reasoning rollout.

    body = LlamaDecoder(model, prompt_ids, capacity)   # one prefill: the prompts' token trie, batch 1
    hidden = body.last_hidden[body.inverse]            # [N, H]: each prompt's last position, after the final norm
    hidden = body.step(tokens)                         # [A, H]: one new token per live row, KV written in place
    body.keep(rows)                                    # the rows still generating, in their order

Why: with no prompt shared, HF's decode step spends ~20 % of its time in per-layer Python (masks, kwargs, cache
objects, repeated K/V for grouped-query attention); this path runs the same GEMMs without it (profiled on SmolLM2, 16
distinct prompts, one thread: 85 % of its decode time is aten::mm at ~58 GFLOP/s, near one AVX2 core's peak, so what
is left to gain there is in the GEMMs both paths share). The prefill runs the prompts' token trie once (tree
attention: a node sees its ancestors, at position = its depth), so a prefix shared by several prompts (a group's
copies, a chat template, "Compute 12+...") is computed once, then each row gathers its path's keys/values
(left-padded), as SGLang's radix cache does. Same tokens and log-probs as the HF model re-run whole, to 1e-5
(tests/test_reasoning_generation.py). Left out: sliding windows, and any Llama variant whose attention HF changes
beyond what its rotary module computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def is_llama(model) -> bool:
    """A LlamaForCausalLM-shaped model (SmolLM2): what LlamaDecoder runs."""
    return getattr(model.config, "model_type", None) == "llama"


def prompt_trie(prompt_ids: list[list[int]]) -> tuple[list[int], list[int], list[list[int]]]:
    """Token lists -> (tokens [T], parents [T] (-1 at a root), paths: each prompt's node ids): one node per distinct
    prefix, so equal prefixes are one node."""
    tokens, parents, children, paths = [], [], {}, []
    for p in prompt_ids:
        node, path = -1, []
        for t in p:
            key = (node, t)
            if key not in children:
                children[key] = len(tokens)
                tokens.append(t)
                parents.append(node)
            node = children[key]
            path.append(node)
        paths.append(path)
    return tokens, parents, paths


def _rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """HF's LlamaRMSNorm.forward, op for op (float32 statistics)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's apply_rotary_pos_emb for one tensor [B, heads, T, D]; cos / sin [B, 1, T, D]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaDecoder:
    def __init__(self, model, prompt_ids: list[list[int]], capacity: int):
        """Prefill `prompt_ids` (non-empty) into KV buffers of `capacity` positions per row (prompt width + new)."""
        self.model, body = model, model.base_model
        self.layers = list(body.layers)
        attn = self.layers[0].self_attn
        self.head_dim, self.scaling, self.groups = attn.head_dim, attn.scaling, attn.num_key_value_groups
        device = next(model.parameters()).device
        tokens, parents, paths = prompt_trie(prompt_ids)
        t = len(tokens)
        # tree attention mask [T, T]: a node attends to itself and its ancestors (its prompt's earlier tokens)
        sees = torch.zeros((t, t), dtype=torch.bool)
        depth = [0] * t
        for i, p in enumerate(parents):
            if p >= 0:
                sees[i] = sees[p]
                depth[i] = depth[p] + 1
            sees[i, i] = True
        width = max(map(len, paths))
        # each row's path, left-padded: gather[n, j] = the node at row n's position j (pads take node 0, masked)
        gather = torch.zeros((len(paths), width), dtype=torch.long)
        self.mask = torch.zeros((len(paths), width), dtype=torch.bool, device=device)  # [N, P]: real keys
        for n, path in enumerate(paths):
            gather[n, width - len(path):] = torch.tensor(path)
            self.mask[n, width - len(path):] = True
        ids = torch.tensor([tokens], device=device)  # [1, T]
        pos = torch.tensor([depth], device=device)  # [1, T]
        self.k = [None] * len(self.layers)  # per layer [N, H_kv, capacity, D]
        self.v = [None] * len(self.layers)
        hidden = self._forward(ids, pos, sees.to(device)[None, None], start=0, trie=True)  # [1, T, H]
        gather = gather.to(device)
        for i in range(len(self.layers)):  # [1, H_kv, T, D] -> each row's path [N, H_kv, P, D] in a fresh buffer
            for buf in (self.k, self.v):
                kv = buf[i]
                out = kv.new_empty(len(paths), kv.shape[1], capacity, self.head_dim)
                out[:, :, :width] = kv[0][:, gather].transpose(0, 1)  # [H_kv, N, P, D] -> [N, H_kv, P, D]
                buf[i] = out
        self.length = width
        # equal prompts end on one node: the head runs once per distinct prompt, its logits go to each copy
        last, self.inverse = torch.tensor([p[-1] for p in paths], device=device).unique(return_inverse=True)
        self.last_hidden = hidden[0, last]  # [U, H]; row n's is last_hidden[inverse[n]]
        self.next_pos = torch.tensor([len(p) for p in paths], device=device)  # [N]

    def keep(self, rows: torch.Tensor) -> None:
        """Keep rows `rows` [A'] of the batch (the ones still generating), dropping the others' caches."""
        self.k = [k[rows] for k in self.k]
        self.v = [v[rows] for v in self.v]
        self.mask, self.next_pos = self.mask[rows], self.next_pos[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [A] (one per live row) -> hidden [A, H] after the final norm; their keys/values join the cache."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)  # [A, L + 1]
        hidden = self._forward(tokens[:, None], self.next_pos[:, None], self.mask[:, None, None], self.length)
        self.length += 1
        self.next_pos = self.next_pos + 1
        return hidden[:, 0]

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, start: int,
                 trie: bool = False) -> torch.Tensor:
        """ids, pos [B, T]; mask [B, 1, T, S] (bool, True = attend) over the S = start + T cached positions."""
        body = self.model.base_model
        h = body.embed_tokens(ids)  # [B, T, H]
        b, t = ids.shape
        cos, sin = body.rotary_emb(h, pos)  # [B, T, D] each, HF's own rotary module
        cos, sin = cos[:, None], sin[:, None]
        for i, layer in enumerate(self.layers):
            a, m = layer.self_attn, layer.mlp
            x = _rms_norm(layer.input_layernorm, h)
            q = _rotate(F.linear(x, a.q_proj.weight, a.q_proj.bias).view(b, t, -1, self.head_dim).transpose(1, 2),
                        cos, sin)  # [B, H_q, T, D]
            k = _rotate(F.linear(x, a.k_proj.weight, a.k_proj.bias).view(b, t, -1, self.head_dim).transpose(1, 2),
                        cos, sin)  # [B, H_kv, T, D]
            v = F.linear(x, a.v_proj.weight, a.v_proj.bias).view(b, t, -1, self.head_dim).transpose(1, 2)
            if trie:  # the prefill: its keys/values are gathered into per-row buffers afterwards
                self.k[i], self.v[i] = k, v
            else:
                self.k[i][:, :, start:start + t] = k
                self.v[i][:, :, start:start + t] = v
                k, v = self.k[i][:, :, :start + t], self.v[i][:, :, :start + t]  # [B, H_kv, S, D]
            if t == 1:  # decode: a key/value head's query heads as T rows ([B, H_kv, G, D]), no repeated K/V
                o = F.scaled_dot_product_attention(q.reshape(b, -1, self.groups, self.head_dim), k, v,
                                                   attn_mask=mask, scale=self.scaling)
                o = o.reshape(b, -1, 1, self.head_dim)  # [B, H_q, 1, D]
            else:
                o = F.scaled_dot_product_attention(q, k.repeat_interleave(self.groups, dim=1),
                                                   v.repeat_interleave(self.groups, dim=1), attn_mask=mask,
                                                   scale=self.scaling)
            h = h + F.linear(o.transpose(1, 2).reshape(b, t, -1), a.o_proj.weight, a.o_proj.bias)
            x = _rms_norm(layer.post_attention_layernorm, h)
            gate = F.linear(x, m.gate_proj.weight, m.gate_proj.bias)
            h = h + F.linear(m.act_fn(gate) * F.linear(x, m.up_proj.weight, m.up_proj.bias), m.down_proj.weight,
                             m.down_proj.bias)
        return _rms_norm(body.norm, h)
